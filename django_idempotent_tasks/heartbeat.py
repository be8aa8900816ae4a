"""The heartbeat that renews a running delivery's lease, the one scheduler thread that starts it,
and the fenced writes that outlast a broken connection while the lease is ours."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from redis.exceptions import RedisError

from django_idempotent_tasks import signals, store

if TYPE_CHECKING:
    from django_idempotent_tasks.delivery import Delivery
    from django_idempotent_tasks.locks import RedisLock

logger = logging.getLogger("django_idempotent_tasks")
RECONNECT_PAUSE = 0.1  # first pause before writing again on a fresh connection; doubles up to 1 s


class Heartbeat(threading.Thread):
    """Calls ``beat`` every ``interval`` seconds until stopped; ``beat`` returning False ends it.

    ``begin()`` hands it to the process's scheduler, which starts the thread only once the first
    beat is due: a body shorter than ``interval`` never pays for a thread of its own. The scheduler
    holds it weakly: whoever begins it keeps it until it stops.
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


def held_write(delivery: Delivery, heartbeat: Heartbeat, write: Callable[[], bool]) -> bool:
    """A fenced write; on a broken connection, reconnect and write again while the lease is ours."""
    connection, pause, again = connections[store.database()], RECONNECT_PAUSE, False
    while True:
        try:
            if not again:
                return write()
            # Issue #25, bounded waits: a write sent again must end before the lease does.
            with store.bounded(heartbeat.lease_until - time.monotonic()):
                return write()
        except (OperationalError, InterfaceError) as exc:
            # Issue #25, hole 6: SQLite's write lock held by another writer, not a lost connection.
            # Waiting is safe past the lease too: the write is fenced, a take-over makes it match nothing.
            if store.is_busy(exc) and time.monotonic() < heartbeat.lease_until + delivery.lock_ttl:
                logger.warning("%s: the database is locked by another writer; writing again.", delivery.label)
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
                continue
            # In an atomic body the transaction died with its connection: nothing is left to complete.
            if delivery.atomic or connection.in_atomic_block or connection.is_usable():
                raise
            if heartbeat.lost.is_set() or time.monotonic() + pause > heartbeat.lease_until:
                raise
            logger.warning(
                "%s: its database connection broke (%r); reconnecting to write again.", delivery.label, exc
            )
            with contextlib.suppress(DatabaseError):
                connection.close()
            time.sleep(pause)
            pause, again = min(pause * 2, 1.0), True


def renew(delivery: Delivery, claim: store.Claim, lock: RedisLock | None, heartbeat: Heartbeat) -> bool:
    """Extend the database lease, then the Redis lock; returns False once the lease is lost."""
    started = time.monotonic()
    try:
        # Issue #25, bounded waits: a renewal stuck on a row lock, a dead socket's peer or a
        # synchronous standby gives up within one beat instead of outliving the lease.
        with store.bounded(delivery.lock_ttl / 3):
            renewed = store.renew(claim, delivery.lock_ttl)
    except Exception as exc:
        logger.warning("%s could not renew its lease: %r.", delivery.label, exc)
        renewed = None
        if time.monotonic() >= heartbeat.lease_until:
            # Unrenewed past its end: another delivery may hold the key now. The body hears of it
            # at its next step or checkpoint (LeaseLost); the fenced completion still decides.
            renewed = False
    finally:
        connections.close_all()
    if renewed is False:
        heartbeat.lost.set()
        if not heartbeat.completing.is_set():  # else our own completion (or failure) has landed
            delivery.send(signals.lease_lost, fence=claim.fence)
            logger.warning("%s lost its lease (fence %d) while running.", delivery.label, claim.fence)
        return False
    if renewed:
        heartbeat.lease_until = started + delivery.lock_ttl
    try:
        if lock is not None and not lock.extend():
            logger.warning("%s: its Redis lock was lost; the database lease still guards it.", delivery.label)
    except RedisError as exc:
        logger.warning("%s could not renew its Redis lock: %r.", delivery.label, exc)
    return True
