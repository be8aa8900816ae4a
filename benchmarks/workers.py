"""Real ``celery worker`` processes for the benchmarks, told what to consume through remote control."""

from __future__ import annotations

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
            )
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[self.name], timeout=0.5):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.label} did not start:\n{self.log.read_text()[-3000:]}")
        return self

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
        """Warm shutdown of our own process group; SIGKILL after 20 s."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=20)
