"""One claim's lease: renewed off the body's thread, lost or being completed, and the fenced writes
that outlast a broken connection while the lease is ours."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from redis.exceptions import RedisError

from django_idempotent_tasks import signals, store
from django_idempotent_tasks.heartbeat import Heartbeat
from django_idempotent_tasks.locks import RedisLock

logger = logging.getLogger("django_idempotent_tasks")
RECONNECT_PAUSE = 0.1  # first pause before writing again on a fresh connection; doubles up to 1 s


class Lease:
    """The lease of one claim: its fence, its Redis lock (if Redis answered) and its heartbeat."""

    def __init__(
        self,
        claim: store.Claim,
        lock: RedisLock | None,
        *,
        label: str,
        ttl: int,
        atomic: bool,
        send: Callable[..., Any],
        uncommitted: bool = False,
    ) -> None:
        self.claim, self.lock = claim, lock
        self.label, self.ttl, self.atomic, self.send = label, ttl, atomic, send
        # Claimed inside the caller's transaction: until it commits, no other connection sees the
        # record (so nothing can take it over), and a renewal from the heartbeat's connection would
        # find no row (PostgreSQL) or wait on its lock (MySQL, SQLite) and take the lease for lost.
        self.uncommitted = uncommitted
        self.lost = threading.Event()  # a renewal found the fence moved on: another delivery holds the key
        # True once the completion is being written: a renewal that finds the record no longer
        # IN_PROGRESS then is our own completion landing, not a lost lease. (A flag the heartbeat's
        # thread reads: nothing waits on it.)
        self.completing = False
        self.until = time.monotonic() + ttl  # by when the database lease runs out, on this process's clock
        self.heartbeat = Heartbeat(ttl / 3, self.renew)

    def begin(self) -> None:
        """Start renewing every ``ttl / 3`` seconds (its callbacks see the caller's context)."""
        self.heartbeat.begin()

    def end(self) -> None:
        """Stop renewing, without waiting for a renewal in flight."""
        self.heartbeat.stop()

    def renew(self) -> bool:
        """Extend the database lease (not an uncommitted claim's), then the Redis lock; returns False
        once the lease is lost."""
        if not self.uncommitted and not self._renew_record():
            return False
        self._extend_lock()
        return True

    def _renew_record(self) -> bool:
        """Extend the record's lease on the database clock; False once the lease is lost."""
        started = time.monotonic()
        try:
            # A renewal stuck on a row lock, a dead socket's peer or a synchronous standby gives up
            # within one beat instead of outliving the lease (issue #25).
            with store.bounded(self.ttl / 3):
                renewed = store.renew(self.claim, self.ttl)
        except Exception as exc:
            logger.warning("%s could not renew its lease: %r.", self.label, exc)
            renewed = None
            if time.monotonic() >= self.until:
                # Unrenewed past its end: another delivery may hold the key now. The body hears of it
                # at its next step or checkpoint (LeaseLost); the fenced completion still decides.
                renewed = False
        finally:
            connections.close_all()
        if renewed is False:
            self.lost.set()
            if not self.completing:  # else our own completion (or failure) has landed
                self.send(signals.lease_lost, fence=self.claim.fence)
                logger.warning("%s lost its lease (fence %d) while running.", self.label, self.claim.fence)
            return False
        if renewed:
            self.until = started + self.ttl
        return True

    def _extend_lock(self) -> None:
        try:
            if self.lock is not None and not self.lock.extend():
                logger.warning("%s: its Redis lock was lost; the database lease still guards it.", self.label)
        except RedisError as exc:
            logger.warning("%s could not renew its Redis lock: %r.", self.label, exc)

    def write(self, write: Callable[[], bool]) -> bool:
        """A fenced write; on a broken connection, reconnect and write again while the lease is ours."""
        connection, pause, again = connections[store.database()], RECONNECT_PAUSE, False
        while True:
            try:
                # Bounded (issue #25): the first write may take until the lease ends, and at least
                # one beat; a write sent again must end before the lease does.
                left = self.until - time.monotonic()
                with store.bounded(left if again else max(left, self.ttl / 3), client_only=not again):
                    return write()
            except (OperationalError, InterfaceError) as exc:
                # SQLite's write lock held by another writer, not a lost connection (issue #25, hole 6).
                # Waiting is safe past the lease too: the write is fenced, a take-over makes it match nothing.
                if store.is_busy(exc) and time.monotonic() < self.until + self.ttl:
                    logger.warning("%s: the database is locked by another writer; writing again.", self.label)
                    time.sleep(pause)
                    pause = min(pause * 2, 1.0)
                    continue
                # In an atomic body the transaction died with its connection: nothing is left to complete.
                if self.atomic or connection.in_atomic_block or store.connection_works(since=None):
                    raise
                if self.lost.is_set() or time.monotonic() + pause > self.until:
                    raise
                logger.warning(
                    "%s: its database connection broke (%r); reconnecting to write again.", self.label, exc
                )
                with contextlib.suppress(DatabaseError):
                    connection.close()
                time.sleep(pause)
                pause, again = min(pause * 2, 1.0), True
