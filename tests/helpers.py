"""Helpers shared by the test modules: polling, worker processes, record and effect counts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def wait_for(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Worker:
    """A real ``celery worker -P prefork`` process of the test app."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        concurrency: int = 2,
        app: str = "tests.celery_app",
        extra: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.env = env
        self.concurrency = concurrency
        self.app = app
        self.extra = extra
        self.log = Path(tempfile.mkdtemp(prefix="idem-worker-")) / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        self.log_file = self.log.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                self.app,
                "worker",
                "-P",
                "prefork",
                "-c",
                str(self.concurrency),
                "--prefetch-multiplier",
                "1",
                "-n",
                f"{self.name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "INFO",
                *self.extra,
            ],
            cwd=ROOT,
            env={**os.environ, **self.env},
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(
            lambda: "ready." in self.output() or self.process.poll() is not None,  # type: ignore[union-attr]
            timeout=60,
            what=f"worker {self.name} to start",
        )
        assert self.process.poll() is None, f"worker {self.name} exited:\n{self.output()[-3000:]}"
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def stop(self) -> None:
        """Warm shutdown; SIGKILL the process group if it takes longer than 15 s."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log_file.close()

    def kill(self) -> None:
        """SIGKILL the main process and its children."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(timeout=15)
        self.log_file.close()
