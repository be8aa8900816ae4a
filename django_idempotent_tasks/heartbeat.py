"""The heartbeat that renews a running delivery's lease, and the one scheduler thread that starts it."""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable


class Heartbeat(threading.Thread):
    """Calls ``beat`` every ``interval`` seconds until stopped; ``beat`` returning False ends it.

    ``begin()`` hands it to the process's scheduler, which starts the thread only once the first
    beat is due: a body shorter than ``interval`` never pays for a thread of its own.
    """

    def __init__(self, interval: float, beat: Callable[[], bool]) -> None:
        super().__init__(name="idempotency-heartbeat", daemon=True)
        self.interval = interval
        self.beat = beat
        self.stopping = threading.Event()
        # Set while the completion is being written: a renewal that finds the record no longer
        # IN_PROGRESS then is our own completion landing, not a lost lease.
        self.completing = threading.Event()
        self.lost = threading.Event()  # a renewal found the fence moved on: another delivery holds the key
        self.lease_until = time.monotonic()  # by when the database lease runs out, on this process's clock

    def begin(self) -> None:
        """Start beating ``interval`` seconds from now."""
        _scheduler.schedule(self)

    def run(self) -> None:
        while not self.stopping.is_set() and self.beat() and not self.stopping.wait(self.interval):
            pass

    def stop(self) -> None:
        """Ask the thread to end without waiting for it (it may be blocked on a row lock)."""
        self.stopping.set()


class _Scheduler:
    """One thread per process that starts each heartbeat when its first beat is due."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.due: list[tuple[float, int, Heartbeat]] = []
        self.order = itertools.count()
        self.pid: int | None = None

    def schedule(self, heartbeat: Heartbeat) -> None:
        with self.condition:
            if self.pid != os.getpid():  # first use in this process (or a forked child): no thread yet
                self.pid, self.due = os.getpid(), []
                threading.Thread(target=self.run, name="idempotency-scheduler", daemon=True).start()
            heapq.heappush(self.due, (time.monotonic() + heartbeat.interval, next(self.order), heartbeat))
            self.condition.notify()

    def run(self) -> None:
        while True:
            with self.condition:
                while not self.due or self.due[0][0] > time.monotonic():
                    self.condition.wait(self.due[0][0] - time.monotonic() if self.due else None)
                heartbeat = heapq.heappop(self.due)[2]
            if not heartbeat.stopping.is_set():
                heartbeat.start()


_scheduler = _Scheduler()
