"""A bare timer: calls a callback every interval off the caller's thread, in a copy of the caller's
context, and the one scheduler thread that starts each timer once its first call is due."""

from __future__ import annotations

import contextvars
import heapq
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable


class Heartbeat:
    """Calls ``beat`` every ``interval`` seconds until stopped; ``beat`` returning False ends it.

    ``begin()`` hands it to the process's scheduler, which starts its thread (``thread``) only once
    the first beat is due: a body shorter than ``interval`` never pays for a thread, nor even for
    the thread object. The scheduler holds it weakly: whoever begins it keeps it until it stops.
    ``beat`` runs in a copy of the context the heartbeat was made in (a new thread starts with an
    empty one), so it sees the caller's context variables, such as the running delivery's log fields.
    """

    def __init__(self, interval: float, beat: Callable[[], bool]) -> None:
        self.interval = interval
        self.beat = beat
        self.stopping = threading.Event()
        self.context = contextvars.copy_context()
        self.thread: threading.Thread | None = None  # started by the scheduler when the first beat is due

    def begin(self) -> None:
        """Start beating ``interval`` seconds from now."""
        _scheduler.schedule(self)

    def start(self) -> None:
        """Start the thread that beats (the scheduler calls it when the first beat is due)."""
        thread = threading.Thread(target=self.run, name="idempotency-heartbeat", daemon=True)
        thread.start()
        self.thread = thread  # only once started: whoever sees it may join it

    def run(self) -> None:
        self.context.run(self.beating)

    def beating(self) -> None:
        while not self.stopping.is_set() and self.beat() and not self.stopping.wait(self.interval):
            pass

    def stop(self) -> None:
        """Ask the thread to end without waiting for it (it may be blocked on a row lock)."""
        if not self.stopping.is_set():  # a delivery stops its heartbeat on more than one path
            self.stopping.set()


class _Scheduler:
    """One thread per process that starts each heartbeat when its first beat is due."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        # (due, order, interval, heartbeat): weakly held, so a delivery that ended before its first
        # beat frees its heartbeat at once instead of when the beat would have been due.
        self.due: list[tuple[float, int, float, weakref.ref[Heartbeat]]] = []
        self.order = itertools.count()
        self.pid: int | None = None

    def schedule(self, heartbeat: Heartbeat) -> None:
        with self.condition:
            if self.pid != os.getpid():  # first use in this process (or a forked child): no thread yet
                self.pid, self.due = os.getpid(), []
                threading.Thread(target=self.run, name="idempotency-scheduler", daemon=True).start()
            interval = heartbeat.interval
            entry = (time.monotonic() + interval, next(self.order), interval, weakref.ref(heartbeat))
            heapq.heappush(self.due, entry)
            # Wake the scheduler only if it must start this one before the one it waits for: waking
            # it for every delivery cost more CPU than the delivery's round trips.
            if self.due[0] is entry:
                self.condition.notify()

    def run(self) -> None:
        while True:
            with self.condition:
                while not self.due or self.due[0][0] > time.monotonic():
                    self.condition.wait(self.due[0][0] - time.monotonic() if self.due else None)
                # Everything due within a tenth of the first one's interval, in one wake-up: a beat
                # started that much early renews early, which is harmless (its lease is 3 intervals).
                until = time.monotonic() + self.due[0][2] / 10
                ready = []
                while self.due and self.due[0][0] <= until:
                    ready.append(heapq.heappop(self.due)[3]())
            for heartbeat in ready:
                if heartbeat is not None and not heartbeat.stopping.is_set():
                    heartbeat.start()


_scheduler = _Scheduler()
