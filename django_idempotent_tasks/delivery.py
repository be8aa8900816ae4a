"""The lifecycle of one delivery on the worker side: replay, lock, claim, body, complete, release."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.db.transaction import TransactionManagementError
from redis.exceptions import RedisError

from django_idempotent_tasks import keys, logs, outages, signals, store, values
from django_idempotent_tasks.exceptions import AttemptsExhausted, IdempotencyKeyMismatch, LeaseLost
from django_idempotent_tasks.idempotency import Idempotency, running
from django_idempotent_tasks.lease import Lease
from django_idempotent_tasks.locks import RedisLock, lock_client, worker_identity
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.outcomes import Busy, Completed, Outcome, Replayed, Requeue
from django_idempotent_tasks.values import UnstorableValue

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
    no_broker: bool  # nothing can re-queue it (apply(), a direct call, @idempotent): it waits or raises

    @property
    def label(self) -> str:
        return f"{self.task_name}[{keys.loggable(self.key)}]"

    def send(self, signal: Any, **kwargs: Any) -> None:
        logs.note(signal, **kwargs)  # first: the log lines about it carry the outcome
        signal.send(sender=self.sender, key=self.key, scope=self.scope, **kwargs)


@dataclass
class Progress:
    """What one ``deliver()`` call has learnt so far: state of this delivery alone."""

    body_error: BaseException | None = None  # what the body raised: its own error, not a lost connection


class Held(Exception):
    """Another delivery holds the key (its Redis lock or its live lease)."""


class LockUnavailable(Exception):
    """Redis could not be asked for the lock."""


def deliver(delivery: Delivery, body: Body) -> Outcome:
    """Run ``body`` at most once concurrently per key; say what happened, or raise the body's error."""
    token = logs.enter(delivery.task_id, delivery.scope, delivery.key)
    try:
        return lifecycle(delivery, body)
    finally:
        logs.leave(token)


def lifecycle(delivery: Delivery, body: Body) -> Outcome:
    """Attempt the delivery until it is done, waits out a conflict, or must be sent again."""
    progress = Progress()
    deadline: float | None = None
    pause = 0.05
    while True:
        try:
            return attempt(delivery, body, progress)
        except Held:
            action = conflict_action(delivery)
        except LockUnavailable:
            return Requeue("Redis could not be asked for the lock")
        except (OperationalError, InterfaceError) as exc:
            return connection_lost(delivery, exc, progress)
        if logger.isEnabledFor(logging.INFO):  # the label is built only for a line that is written
            logger.info("%s is held by another delivery; on_conflict=%s.", delivery.label, action)
        if action != "wait":
            return Busy(action, f"{delivery.label} is being executed by another delivery.")
        deadline = deadline or time.monotonic() + delivery.lock_ttl
        if time.monotonic() > deadline:
            waited = f"after waiting {delivery.lock_ttl} s"
            return Busy("wait", f"{delivery.label} was still held by another delivery {waited}.")
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def conflict_action(delivery: Delivery) -> str:
    """The on_conflict action for a held key (with no broker to re-queue to, it waits), signalled."""
    action = "wait" if delivery.no_broker and delivery.on_conflict == "retry" else delivery.on_conflict
    # "raise" answers only for a live holder (issue #25, hole 2). A lock without one (the holder
    # died; or it was this very message, which the broker gave back) is waited out, or re-queued.
    if action == "raise" and not store.held_by_another(delivery.scope, delivery.key, delivery.task_id):
        action = "wait" if delivery.no_broker else "retry"
    delivery.send(signals.lock_conflict, action=action)
    return action


def connection_lost(
    delivery: Delivery, exc: OperationalError | InterfaceError, progress: Progress
) -> Requeue:
    """A broken database connection: re-queue the delivery (with no broker, raise), or the body's own error."""
    if exc is progress.body_error:
        raise exc  # the body's own error (deadlock, lock timeout): its retry policy decides
    # The connection broke (backend terminated, server restarted): whatever ran under it rolled
    # back, so send the delivery again instead of acking it as a failure. Close the broken
    # connection, or every later task of this process would fail on it too.
    logger.warning("%s lost its database connection: %r; sending it again.", delivery.label, exc)
    with contextlib.suppress(DatabaseError):
        connections[store.database()].close()
    if delivery.no_broker:
        raise exc
    outages.connection_failed(exc, lease_seconds=delivery.lock_ttl, send=delivery.send)
    return Requeue("the database connection was lost")


def attempt(delivery: Delivery, body: Body, progress: Progress) -> Replayed | Completed:
    """One pass of the lifecycle; raises Held when another delivery holds the key."""
    record = store.lookup(delivery.scope, delivery.key)
    if record is not None:
        replayed = settled(delivery, record)
        if replayed is not None:
            return replayed
    lock = RedisLock(lock_client(), keys.lock_name(delivery.scope, delivery.key), delivery.lock_ttl)
    held = acquire(delivery, lock)
    try:
        claim = claim_record(delivery, record)
        if claim is None:
            raise Held
        return run_claimed(delivery, claim, body, lock if held else None, progress)
    finally:
        if held:
            release(delivery, lock)


def claim_record(delivery: Delivery, record: store.Snapshot | None) -> store.Claim | None:
    """Insert the key IN_PROGRESS or take its record over; None while another lease is live."""
    lease: dict[str, Any] = {"task_id": delivery.task_id, "worker": worker_identity()}
    lease.update(lease_seconds=delivery.lock_ttl, record_ttl=delivery.record_ttl)
    # Bounded like a renewal (issue #25): a claim stuck on a row lock, a synchronous standby or a
    # peer gone silent gives up within one beat. Inside a caller's transaction, the caller's bounds.
    with (
        contextlib.nullcontext()
        if store.in_transaction()
        else store.bounded(delivery.lock_ttl / 3, client_only=True)
    ):
        if record is not None:
            return store.take_over(record, **lease)
        key, task_name, fingerprint = delivery.key, delivery.task_name, delivery.fingerprint
        return store.insert(delivery.scope, key, task_name=task_name, fingerprint=fingerprint, **lease)


def settled(delivery: Delivery, record: store.Snapshot) -> Replayed | None:
    """The answer an existing record gives without running the body, or None to go on."""
    if record.fingerprint != delivery.fingerprint:
        outcome = {"idempotency_outcome": "mismatch"}
        logger.error(
            "%s was sent again with different arguments; not executed.", delivery.label, extra=outcome
        )
        raise IdempotencyKeyMismatch(
            f"The idempotency key {keys.loggable(delivery.key)!r} of {delivery.task_name!r} was used "
            "before with different arguments. Use a new key for new work."
        )
    if record.status == Status.SUCCEEDED:
        delivery.send(signals.task_replayed)
        if logger.isEnabledFor(logging.INFO):  # every replay passes here: no label below INFO
            logger.info("%s already succeeded; replaying the stored result.", delivery.label)
        return Replayed(record.result)
    # Whether a lease is live is decided by the claim's SQL on the database clock, not here.
    if store.is_exhausted(record, delivery.max_attempts):
        if not store.exhaust(record, delivery.max_attempts):
            raise Held  # its last attempt is still running
        delivery.send(signals.attempts_exhausted, attempts=record.attempts)
        logger.error("%s used up its %d attempts; failed for good.", delivery.label, record.attempts)
        raise AttemptsExhausted(
            f"{delivery.label} failed for good after {record.attempts} attempts "
            f"(max_attempts={delivery.max_attempts}). Last error: {(record.error or {}).get('message', '')}"
        )
    return None


def acquire(delivery: Delivery, lock: RedisLock) -> bool:
    """Take the Redis lock (True); raises Held if another delivery has it.

    When Redis cannot be asked, a worker re-queues the delivery; with no broker to re-queue it to,
    it goes on under the database lease alone (False).
    """
    try:
        if lock.acquire():
            return True
    except RedisError as exc:
        logger.warning("%s could not ask Redis for its lock: %r.", delivery.label, exc)
        if delivery.no_broker:
            return False
        raise LockUnavailable from exc
    raise Held


def release(delivery: Delivery, lock: RedisLock) -> None:
    try:
        if not lock.release():
            logger.warning("%s: its Redis lock had expired or been taken before release.", delivery.label)
    except RedisError as exc:
        logger.warning("%s could not release its Redis lock: %r.", delivery.label, exc)


def run_claimed(
    delivery: Delivery, claim: store.Claim, body: Body, lock: RedisLock | None, progress: Progress
) -> Replayed | Completed:
    """Run the body under a claimed lease, renewed in the background, and store the outcome."""
    delivery.send(signals.task_claimed, fence=claim.fence, attempt=claim.attempt, recovered=claim.recovered)
    if claim.recovered:
        logger.warning(
            "%s: an earlier attempt died mid-body; attempt %d takes over.", delivery.label, claim.attempt
        )
    lease = Lease(
        claim,
        lock,
        label=delivery.label,
        ttl=delivery.lock_ttl,
        atomic=delivery.atomic,
        send=delivery.send,
        uncommitted=store.in_transaction(),  # claimed in the caller's transaction
    )
    idempotency = Idempotency(delivery.key, delivery.scope, claim, delivery.max_result_bytes, lease.lost)
    lease.begin()
    token = running.set(idempotency)
    try:
        if delivery.atomic:
            completed: Completed | None = None
            try:
                with transaction.atomic(using=store.database()):
                    completed = finish(delivery, lease, call_body(body, idempotency, progress))
            except (OperationalError, InterfaceError):
                # The COMMIT's reply was lost (issue #25, hole 10). Read the record at our claim
                # token: if the completion committed, this delivery is done (its on_commit signal
                # was dropped with the connection).
                if completed is None or not store.committed(claim):
                    raise
                delivery.send(signals.task_completed, fence=claim.fence)
            return completed
        return finish(delivery, lease, call_body(body, idempotency, progress))
    except BaseException as exc:
        if isinstance(exc, LeaseLost) and lost_by_this_delivery(exc, progress, lease):
            return lease_lost(delivery, claim)
        if exc is not progress.body_error:
            raise  # the completion's own failure is never "the body failed"
        lease.completing = True  # the failure write ends the lease: not a lost lease
        record_failure(delivery, lease, exc)
        raise
    finally:
        lease.end()
        running.reset(token)


def lost_by_this_delivery(exc: LeaseLost, progress: Progress, lease: Lease) -> bool:
    """``exc`` says that this delivery lost its key: raised by its completion, or by the body on its
    lease's word (a step, a checkpoint). A LeaseLost the body raised with this lease intact is another
    key's (an idempotent call inside the body that lost its own): the body's error."""
    return exc is not progress.body_error or lease.lost.is_set()


def call_body(body: Body, idempotency: Idempotency, progress: Progress) -> Any:
    """Run the body, remembering what it raised: its database errors are its own, not a lost connection."""
    connection = store.raw_connection()
    autocommit = not store.in_transaction()
    try:
        value = body(idempotency)
        # Issue #25, holes 4 and 5: a body that broke its transaction or left autocommit off fails
        # here, as its own error, rather than have its completion refused or never committed.
        problem = store.unusable_transaction(autocommit)
        if problem is not None:
            raise TransactionManagementError(problem)
        return value
    except (OperationalError, InterfaceError) as exc:
        # A deadlock or a timeout on a working connection is the body's; a dead connection is not:
        # the delivery is sent again and the next holder takes the key over, recovered. A body that
        # reconnected (a long task refreshing its connection) owns what the server refused it on the
        # new one.
        if store.connection_works(since=connection) or (
            store.refused_by_server(exc) and store.connection_works(since=None)
        ):
            progress.body_error = exc
        raise
    except BaseException as exc:
        progress.body_error = exc
        raise


def finish(delivery: Delivery, lease: Lease, value: Any) -> Completed:
    """Fenced completion; raises LeaseLost (rolling back an atomic body) if the fence moved on."""
    claim = lease.claim
    stored, problem = values.encode_result(value, delivery.max_result_bytes, jsonb=store.stores_jsonb())
    if problem is None:
        try:
            lease.completing = True
            done = lease.write(lambda: store.complete(claim, stored, None, delivery.record_ttl))
        except (OperationalError, InterfaceError):
            raise  # the connection, not the value: nothing was written
        except DatabaseError as exc:  # refused for a reason we did not foresee: still done, loudly
            problem = f"The database refused the result: {exc!r}"
    if problem is not None:
        stored = None
        delivery.send(signals.result_unstorable, reason=problem)
        logger.error("%s succeeded but its result cannot be stored: %s", delivery.label, problem)
        error = values.error_shape("UnstorableResult", problem)
        done = lease.write(lambda: store.complete(claim, None, error, delivery.record_ttl))
    lease.end()
    if not done:
        raise LeaseLost(f"{delivery.label} lost its lease (fence {claim.fence}) before completing.")
    if delivery.atomic:  # the completion commits with the body's transaction: tell receivers after it
        transaction.on_commit(
            functools.partial(delivery.send, signals.task_completed, fence=claim.fence),
            using=store.database(),
        )
    else:
        delivery.send(signals.task_completed, fence=claim.fence)
    return Completed(stored, problem)


def lease_lost(delivery: Delivery, claim: store.Claim) -> Replayed:
    """A newer holder took over: answer with its result, or treat it as a conflict."""
    delivery.send(signals.lease_lost, fence=claim.fence)
    logger.warning("%s lost its lease (fence %d); its completion was refused.", delivery.label, claim.fence)
    store.note_lease_lost(claim)
    record = store.lookup(delivery.scope, delivery.key)
    if record is not None and record.status == Status.SUCCEEDED:
        return Replayed(record.result)
    if delivery.on_conflict == "raise":
        raise LeaseLost(f"{delivery.label} lost its lease (fence {claim.fence}) to another delivery.")
    raise Held


def record_failure(delivery: Delivery, lease: Lease, exc: BaseException) -> None:
    cause = getattr(exc, "exc", None) or exc  # celery's Retry wraps the real error
    # A value the database refuses was already computed by a step: running the body again would
    # repeat that step, so the key fails for good.
    for_good = delivery.max_attempts if isinstance(cause, UnstorableValue) else None
    error = values.describe_error(cause)
    claim = lease.claim
    if lease.write(lambda: store.fail(claim, error, for_good_after=for_good)):
        delivery.send(signals.task_failed, fence=claim.fence, exc=cause)
        logger.info(
            "%s failed with %s; the next delivery may run it again.", delivery.label, values.error_repr(cause)
        )
    else:
        logger.warning("%s failed with %s after losing its lease.", delivery.label, values.error_repr(cause))
