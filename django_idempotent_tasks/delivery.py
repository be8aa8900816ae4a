"""The lifecycle of one delivery on the worker side: replay, lock, claim, body, complete, release."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from redis.exceptions import RedisError

from django_idempotent_tasks import keys, logs, signals, store
from django_idempotent_tasks.exceptions import (
    AttemptsExhausted,
    IdempotencyKeyMismatch,
    LeaseLost,
    TaskInProgress,
)
from django_idempotent_tasks.idempotency import Idempotency
from django_idempotent_tasks.locks import Heartbeat, RedisLock, lock_client, worker_identity
from django_idempotent_tasks.models import IdempotencyRecord

logger = logging.getLogger("django_idempotent_tasks")
Status = IdempotencyRecord.Status
Body = Callable[[Idempotency], Any]


@dataclass(frozen=True)
class Delivery:
    """One delivery of an idempotent task, with the options that apply to it."""

    sender: Any
    task_name: str
    key: str
    scope: str
    fingerprint: str
    task_id: str
    lock_ttl: int
    record_ttl: int
    on_conflict: str
    atomic: bool
    max_attempts: int
    max_result_bytes: int
    eager: bool

    @property
    def label(self) -> str:
        return f"{self.task_name}[{keys.loggable(self.key)}]"

    def send(self, signal: Any, **kwargs: Any) -> None:
        signal.send(sender=self.sender, key=self.key, scope=self.scope, **kwargs)


class Busy(Exception):
    """Another delivery holds the key (its Redis lock or its live lease)."""


class LockUnavailable(Exception):
    """Redis could not be asked for the lock."""


def deliver(delivery: Delivery, body: Body, requeue: Callable[[], NoReturn]) -> Any:
    """Run ``body`` at most once concurrently per key and return the (stored) result."""
    logs.begin(delivery)
    deadline: float | None = None
    pause = 0.05
    while True:
        try:
            return attempt(delivery, body)
        except Busy:
            action = "wait" if delivery.eager and delivery.on_conflict == "retry" else delivery.on_conflict
            delivery.send(signals.lock_conflict, action=action)
        except LockUnavailable:
            requeue()
        except (OperationalError, InterfaceError) as exc:
            # The connection broke (backend terminated, server restarted): whatever ran under it
            # rolled back, so send the delivery again instead of acking it as a failure. Close the
            # broken connection, or every later task of this process would fail on it too.
            logger.warning("%s lost its database connection: %r; sending it again.", delivery.label, exc)
            with contextlib.suppress(DatabaseError):
                connections[store.database()].close()
            if delivery.eager:
                raise
            requeue()
        logger.info("%s is held by another delivery; on_conflict=%s.", delivery.label, action)
        if action == "raise":
            raise TaskInProgress(f"{delivery.label} is being executed by another delivery.")
        if action == "retry":
            requeue()
        deadline = deadline or time.monotonic() + delivery.lock_ttl
        if time.monotonic() > deadline:
            raise TaskInProgress(
                f"{delivery.label} was still held by another delivery after waiting {delivery.lock_ttl} s."
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def attempt(delivery: Delivery, body: Body) -> Any:
    """One pass of the lifecycle; raises Busy when another delivery holds the key."""
    record = store.lookup(delivery.scope, delivery.key)
    if record is not None:
        answer = settled(delivery, record)
        if answer is not None:
            return answer[0]
    lock = RedisLock(lock_client(), keys.lock_name(delivery.scope, delivery.key), delivery.lock_ttl)
    held = acquire(delivery, lock)
    try:
        claim = (
            store.take_over(
                record,
                task_id=delivery.task_id,
                worker=worker_identity(),
                lease_seconds=delivery.lock_ttl,
                record_ttl=delivery.record_ttl,
            )
            if record is not None
            else store.insert(
                delivery.scope,
                delivery.key,
                task_name=delivery.task_name,
                fingerprint=delivery.fingerprint,
                task_id=delivery.task_id,
                worker=worker_identity(),
                lease_seconds=delivery.lock_ttl,
                record_ttl=delivery.record_ttl,
            )
        )
        if claim is None:
            raise Busy
        return run_claimed(delivery, claim, body, lock if held else None)
    finally:
        if held:
            release(delivery, lock)


def settled(delivery: Delivery, record: IdempotencyRecord) -> tuple[Any] | None:
    """The answer an existing record gives without running the body, or None to go on."""
    if record.fingerprint != delivery.fingerprint:
        logger.error("%s was sent again with different arguments; not executed.", delivery.label)
        raise IdempotencyKeyMismatch(
            f"The idempotency key {keys.loggable(delivery.key)!r} of {delivery.task_name!r} was used "
            "before with different arguments. Use a new key for new work."
        )
    if record.status == Status.SUCCEEDED:
        logger.info("%s already succeeded; replaying the stored result.", delivery.label)
        delivery.send(signals.task_replayed)
        return (record.result,)
    if record.lease_is_live:
        raise Busy
    if store.is_exhausted(record, delivery.max_attempts):
        store.exhaust(record, delivery.max_attempts)
        logger.error("%s used up its %d attempts; failed for good.", delivery.label, record.attempts)
        delivery.send(signals.attempts_exhausted, attempts=record.attempts)
        raise AttemptsExhausted(
            f"{delivery.label} failed for good after {record.attempts} attempts "
            f"(max_attempts={delivery.max_attempts}). Last error: {(record.error or {}).get('message', '')}"
        )
    return None


def acquire(delivery: Delivery, lock: RedisLock) -> bool:
    """Take the Redis lock (True); raises Busy if another delivery has it.

    When Redis cannot be asked, a worker re-queues the delivery; an eager call has nobody to
    re-queue it and goes on under the database lease alone (False).
    """
    try:
        if lock.acquire():
            return True
    except RedisError as exc:
        logger.warning("%s could not ask Redis for its lock: %r.", delivery.label, exc)
        if delivery.eager:
            return False
        raise LockUnavailable from exc
    raise Busy


def release(delivery: Delivery, lock: RedisLock) -> None:
    try:
        if not lock.release():
            logger.warning("%s: its Redis lock had expired or been taken before release.", delivery.label)
    except RedisError as exc:
        logger.warning("%s could not release its Redis lock: %r.", delivery.label, exc)


def run_claimed(delivery: Delivery, claim: store.Claim, body: Body, lock: RedisLock | None) -> Any:
    """Run the body under a claimed lease, renewed in the background, and store the outcome."""
    delivery.send(signals.task_claimed, fence=claim.fence, attempt=claim.attempt, recovered=claim.recovered)
    if claim.recovered:
        logger.warning(
            "%s: an earlier attempt died mid-body; attempt %d takes over.", delivery.label, claim.attempt
        )
    idempotency = Idempotency(delivery.key, delivery.scope, claim, delivery.max_result_bytes)
    heartbeat = Heartbeat(delivery.lock_ttl / 3, lambda: renew(delivery, claim, lock, heartbeat))
    logs.follow(heartbeat)
    heartbeat.begin()
    try:
        if delivery.atomic:
            with transaction.atomic(using=store.database()):
                return finish(delivery, claim, body(idempotency), heartbeat)
        return finish(delivery, claim, body(idempotency), heartbeat)
    except LeaseLost:
        return lease_lost(delivery, claim)
    except BaseException as exc:
        heartbeat.stop()  # first, so a renewal racing the failure write is not reported as a lost lease
        record_failure(delivery, claim, exc)
        raise
    finally:
        heartbeat.stop()


def finish(delivery: Delivery, claim: store.Claim, value: Any, heartbeat: Heartbeat) -> Any:
    """Fenced completion; raises LeaseLost (rolling back an atomic body) if the fence moved on."""
    heartbeat.stop()
    stored, problem = store.encode_result(value, delivery.max_result_bytes)
    error = None
    if problem is not None:
        logger.error("%s succeeded but its result cannot be stored: %s", delivery.label, problem)
        delivery.send(signals.result_unstorable, reason=problem)
        error = {"type": "UnstorableResult", "message": problem, "traceback": ""}
    if not store.complete(claim, stored, error, delivery.record_ttl):
        raise LeaseLost(f"{delivery.label} lost its lease (fence {claim.fence}) before completing.")
    delivery.send(signals.task_completed, fence=claim.fence)
    return stored


def lease_lost(delivery: Delivery, claim: store.Claim) -> Any:
    """A newer holder took over: answer with its result, or treat it as a conflict."""
    logger.warning("%s lost its lease (fence %d); its completion was refused.", delivery.label, claim.fence)
    delivery.send(signals.lease_lost, fence=claim.fence)
    record = store.lookup(delivery.scope, delivery.key)
    if record is not None and record.status == Status.SUCCEEDED:
        return record.result
    if delivery.on_conflict == "raise":
        raise LeaseLost(f"{delivery.label} lost its lease (fence {claim.fence}) to another delivery.")
    raise Busy


def record_failure(delivery: Delivery, claim: store.Claim, exc: BaseException) -> None:
    cause = getattr(exc, "exc", None) or exc  # celery's Retry wraps the real error
    if store.fail(claim, store.describe_error(cause), delivery.record_ttl):
        logger.info("%s failed with %r; the next delivery may run it again.", delivery.label, cause)
        delivery.send(signals.task_failed, fence=claim.fence, exc=cause)
    else:
        logger.warning("%s failed with %r after losing its lease.", delivery.label, cause)


def renew(delivery: Delivery, claim: store.Claim, lock: RedisLock | None, heartbeat: Heartbeat) -> bool:
    """Extend the Redis lock and the database lease; returns False once the lease is lost."""
    try:
        if lock is not None and not lock.extend():
            logger.warning("%s: its Redis lock was lost; the database lease still guards it.", delivery.label)
    except RedisError as exc:
        logger.warning("%s could not renew its Redis lock: %r.", delivery.label, exc)
    try:
        renewed = store.renew(claim, delivery.lock_ttl)
    except Exception as exc:
        logger.warning("%s could not renew its lease: %r.", delivery.label, exc)
        return True
    finally:
        connections.close_all()
    if not renewed and not heartbeat.stopping.is_set():
        logger.warning("%s lost its lease (fence %d) while running.", delivery.label, claim.fence)
        delivery.send(signals.lease_lost, fence=claim.fence)
    return renewed
