"""Real ``celery worker -P prefork`` processes for the demo, each in its own process group."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

PROJECT_DIR = Path(__file__).resolve().parent.parent.parent


def _die_with_parent() -> None:
    # If the demo itself is SIGKILLed, its workers get a SIGTERM instead of living on (Linux only).
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Worker:
    """One worker main process and its pool children, all in one process group."""

    def __init__(self, name: str, queue: str, log_dir: Path, env: dict[str, str], concurrency: int) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self.command = [
            sys.executable, "-m", "celery", "-A", "example_project", "worker",
            "-P", "prefork", "-c", str(concurrency), "-Q", queue, "-n", f"{name}@%h",
            "--prefetch-multiplier", "1", "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-l", "INFO",
        ]  # fmt: skip
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=PROJECT_DIR,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def ready(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"Worker {self.name} exited early:\n{self.output()[-3000:]}")
        return " ready." in self.output()

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the whole process group, then SIGKILL whatever is left of it."""
        if self.process is None:
            return
        group = self.process.pid
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(group, self.process):
                time.sleep(0.1)
            if not _group_alive(group, self.process):
                break
        self.process.wait(timeout=timeout)


def _group_alive(group: int, process: subprocess.Popen[bytes]) -> bool:
    process.poll()  # reap the main process so that it does not count as alive
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


class WorkerGroup:
    """Start ``count`` workers on ``queue``; stop all of them on exit, whatever happened."""

    def __init__(
        self, count: int, queue: str, log_dir: Path, env: dict[str, str], concurrency: int = 2
    ) -> None:
        full_env = {**os.environ, **env}
        self.workers = [
            Worker(f"demo{n}", queue, log_dir, full_env, concurrency) for n in range(1, count + 1)
        ]

    def __enter__(self) -> WorkerGroup:
        try:
            for worker in self.workers:
                worker.start()
            deadline = time.monotonic() + 90
            while not all(worker.ready() for worker in self.workers):
                if time.monotonic() > deadline:
                    raise RuntimeError("The demo's workers did not start within 90 s.")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        for worker in self.workers:
            if worker.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.process.pid, signal.SIGTERM)
        for worker in self.workers:
            worker.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {w.name} ({w.log}) ---\n{w.output()[-2000:]}" for w in self.workers)
