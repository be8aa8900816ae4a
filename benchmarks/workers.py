"""Real ``celery worker`` processes for the benchmarks, told what to consume through remote control."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.celery_app import app

ROOT = Path(__file__).resolve().parent.parent
IDLE_QUEUE = "celery"  # consumed all along: where a conflicting delivery re-queues itself
QUEUE = "bench"  # staged while nobody consumes it, then opened to the worker at once
STARTUP = 60  # seconds a worker has to answer a ping
PR_SET_PDEATHSIG = 1
#: The workers started and not yet stopped, for stop_all() on every exit path.
running: set[Worker] = set()


def _die_with_parent() -> None:
    # In the child, before exec: SIGTERM it when the benchmark's process dies, even by SIGKILL,
    # since its own session keeps it from the terminal's Ctrl-C and from make's signals.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_all() -> None:
    """Stop every worker still running (the benchmark's last word on any exit path)."""
    for worker in list(running):
        worker.stop()


def kill_all() -> None:
    """SIGKILL every worker's process group at once."""
    for worker in list(running):
        worker.kill()


class Worker:
    """One ``celery worker -P <pool> -c <n>`` of the benchmark app."""

    def __init__(self, pool: str, concurrency: int) -> None:
        self.pool = pool
        self.concurrency = concurrency
        self.name = f"bench-{pool}-{os.getpid()}@{socket.gethostname()}"
        self.log = Path(tempfile.mkdtemp(prefix="idem-bench-")) / "worker.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def label(self) -> str:
        return "-P solo" if self.pool == "solo" else f"-P {self.pool} -c {self.concurrency}"

    def start(self) -> Worker:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "celery", "-A", "benchmarks.celery_app", "worker"),
                    *("-P", self.pool, "-c", str(self.concurrency), "-Q", IDLE_QUEUE, "-n", self.name),
                    *("--prefetch-multiplier", "1", "--without-gossip", "--without-mingle"),
                    *("--without-heartbeat", "-l", "WARNING"),
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        running.add(self)
        started = last_print = time.monotonic()
        while not app.control.ping(destination=[self.name], timeout=0.5):
            now = time.monotonic()
            if self.process.poll() is not None or now - started > STARTUP:
                state = "exited" if self.process.poll() is not None else f"did not answer in {STARTUP} s"
                self.stop()
                raise SystemExit(
                    f"benchmarks: worker {self.label} {state}; its log ends with:\n{self.tail()}"
                )
            if now - last_print >= 5:
                last_print = now
                print(
                    f"  … waiting for worker {self.label} ({now - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
        return self

    def tail(self, lines: int = 20) -> str:
        """The last lines of the worker's log."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def consume(self, on: bool) -> None:
        """Open (or close) the staged queue to this worker; returns once the worker confirmed."""
        command = app.control.add_consumer if on else app.control.cancel_consumer
        if not command(QUEUE, destination=[self.name], reply=True, timeout=10):
            raise RuntimeError(f"worker {self.label} did not answer {command.__name__}")

    def pids(self) -> list[int]:
        assert self.process is not None
        children = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True)
        return [self.process.pid, *(int(pid) for pid in children.stdout.split())]

    def rss_kib(self) -> list[int]:
        """Resident memory of the main process and of each child, in KiB."""
        sizes = []
        for pid in self.pids():
            status = Path(f"/proc/{pid}/status").read_text()
            sizes.append(
                int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
            )
        return sizes

    def stop(self) -> None:
        """Warm shutdown of the worker's process group; SIGKILL after 20 s (or at once by kill_all,
        on a second interrupt: the worker stays in ``running`` until it is gone)."""
        try:
            if self.process is None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
                self.process.wait(timeout=20)
            self.kill()  # a prefork child that outlived its parent is still in the group
        finally:
            running.discard(self)

    def kill(self) -> None:
        """SIGKILL the worker's process group."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
