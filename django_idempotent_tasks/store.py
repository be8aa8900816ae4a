"""Every read and write of idempotency records on the delivery path: the only place they happen."""

from __future__ import annotations

import functools
import json
import traceback
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import Q
from django.utils import timezone

from django_idempotent_tasks.keys import canonical_json
from django_idempotent_tasks.models import IdempotencyRecord

Status = IdempotencyRecord.Status


@dataclass(frozen=True)
class Claim:
    """The lease a delivery holds on a record: only writes carrying its fence succeed."""

    record: IdempotencyRecord
    fence: int
    attempt: int
    recovered: bool


def database() -> str:
    """Alias of the database that holds the records."""
    return router.db_for_write(IdempotencyRecord)


def records() -> Any:
    return IdempotencyRecord.objects.using(database())


def lookup(scope: str, key: str) -> IdempotencyRecord | None:
    """The record of a scoped key (one indexed SELECT), or None."""
    # Every replay is this one query: raw SQL skips the ORM's per-call compilation (and first()'s
    # ORDER BY), which cost more than the round trip itself (see BENCHMARKS.md).
    alias = database()
    return next(iter(records().raw(_lookup_sql(alias), [scope, key])), None)


@functools.cache
def _lookup_sql(alias: str) -> str:
    meta, quote = IdempotencyRecord._meta, connections[alias].ops.quote_name
    columns = {field.name: quote(field.column or field.name) for field in meta.concrete_fields}
    scope, key = columns["scope"], columns["key"]
    return f"SELECT * FROM {quote(meta.db_table)} WHERE {scope} = %s AND {key} = %s"


def _savepoint() -> AbstractContextManager[Any]:
    # Inside a caller's transaction an IntegrityError would poison it: isolate the INSERT.
    # In autocommit mode the INSERT is its own transaction and a savepoint costs two round trips.
    alias = database()
    return (
        transaction.atomic(using=alias)
        if transaction.get_connection(alias).in_atomic_block
        else nullcontext()
    )


def insert(
    scope: str,
    key: str,
    *,
    task_name: str,
    fingerprint: str,
    task_id: str,
    worker: str,
    lease_seconds: int,
    record_ttl: int,
) -> Claim | None:
    """Create the record IN_PROGRESS with fence 1; None if another delivery created it first."""
    now = timezone.now()
    try:
        with _savepoint():
            record = records().create(
                scope=scope,
                key=key,
                task_name=task_name,
                fingerprint=fingerprint,
                task_id=task_id,
                worker=worker,
                started_at=now,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
                expires_at=now + timedelta(seconds=record_ttl),
            )
    except IntegrityError:
        return None
    return Claim(record=record, fence=1, attempt=1, recovered=False)


def take_over(
    record: IdempotencyRecord, *, task_id: str, worker: str, lease_seconds: int, record_ttl: int
) -> Claim | None:
    """Claim a FAILED record or one whose lease expired; None if someone else moved it first."""
    now = timezone.now()
    claimable = Q(status=Status.FAILED) | Q(status=Status.IN_PROGRESS, lease_expires_at__lt=now)
    fence, attempt = record.fence + 1, record.attempts + 1
    changes: dict[str, Any] = {
        "status": Status.IN_PROGRESS,
        "fence": fence,
        "attempts": attempt,
        "task_id": task_id,
        "worker": worker,
        "started_at": now,
        "completed_at": None,
        "lease_expires_at": now + timedelta(seconds=lease_seconds),
        "expires_at": now + timedelta(seconds=record_ttl),
    }
    if not records().filter(claimable, pk=record.pk, fence=record.fence).update(**changes):
        return None
    recovered = record.status == Status.IN_PROGRESS
    for name, value in changes.items():
        setattr(record, name, value)
    # The snapshot may predate a checkpoint the old holder committed since (its step transaction
    # held the row while we waited): resume from what is committed, or a finished step runs again.
    record.steps = records().filter(pk=record.pk).values_list("steps", flat=True).get()
    return Claim(record=record, fence=fence, attempt=attempt, recovered=recovered)


def _update_held(claim: Claim, **values: Any) -> bool:
    """``UPDATE … WHERE pk AND fence = mine AND status = IN_PROGRESS``; False if the fence moved on.

    One precompiled statement per set of columns: building the ORM's UPDATE cost more CPU than its
    round trip (see BENCHMARKS.md). Values are prepared by their fields, as the ORM would.
    """
    alias = database()
    connection = connections[alias]
    fields = {field.name: field for field in IdempotencyRecord._meta.concrete_fields}
    params = [fields[name].get_db_prep_save(value, connection) for name, value in values.items()]
    with connection.cursor() as cursor:
        cursor.execute(
            _update_held_sql(alias, tuple(values)),
            [*params, claim.record.pk, claim.fence, Status.IN_PROGRESS],
        )
        return bool(cursor.rowcount == 1)


@functools.cache
def _update_held_sql(alias: str, names: tuple[str, ...]) -> str:
    meta, quote = IdempotencyRecord._meta, connections[alias].ops.quote_name
    column = {field.name: quote(field.column or field.name) for field in meta.concrete_fields}
    assignments = ", ".join(f"{column[name]} = %s" for name in names)
    where = f"{column[meta.pk.name]} = %s AND {column['fence']} = %s AND {column['status']} = %s"
    return f"UPDATE {quote(meta.db_table)} SET {assignments} WHERE {where}"


def renew(claim: Claim, lease_seconds: int) -> bool:
    """Extend the lease; False if the fence moved on (the lease is lost)."""
    return _update_held(claim, lease_expires_at=timezone.now() + timedelta(seconds=lease_seconds))


def checkpoint(claim: Claim, steps: dict[str, Any]) -> bool:
    """Store the steps finished so far; False if the fence moved on."""
    return _update_held(claim, steps=steps)


def complete(claim: Claim, result: Any, error: dict[str, str] | None, record_ttl: int) -> bool:
    """Mark the key SUCCEEDED with its result; False if the fence moved on."""
    return _finish(claim, Status.SUCCEEDED, result, error, record_ttl)


def fail(claim: Claim, error: dict[str, str], record_ttl: int) -> bool:
    """Mark the key FAILED (the next delivery may run it again); False if the fence moved on."""
    return _finish(claim, Status.FAILED, None, error, record_ttl)


def _finish(claim: Claim, status: str, result: Any, error: dict[str, str] | None, record_ttl: int) -> bool:
    now = timezone.now()
    return _update_held(
        claim,
        status=status,
        result=result,
        error=error,
        completed_at=now,
        lease_expires_at=None,
        expires_at=now + timedelta(seconds=record_ttl),
    )


def exhaust(record: IdempotencyRecord, max_attempts: int) -> None:
    """Fail a key for good: it used up ``max_attempts`` claims (crashes or failures)."""
    error = {
        "type": "AttemptsExhausted",
        "message": f"{record.attempts} attempts used, max_attempts is {max_attempts}.",
        "traceback": "",
    }
    now = timezone.now()
    records().filter(pk=record.pk, fence=record.fence).exclude(status=Status.SUCCEEDED).update(
        status=Status.FAILED, error=error, lease_expires_at=None, completed_at=now
    )
    record.status, record.error = Status.FAILED, error


def is_exhausted(record: IdempotencyRecord, max_attempts: int) -> bool:
    """The key cannot be claimed again."""
    return record.status != Status.SUCCEEDED and record.attempts >= max_attempts


def describe_error(exc: BaseException) -> dict[str, str]:
    """The JSON stored for a failure: type, message and traceback."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def encode_result(value: Any, max_bytes: int) -> tuple[Any, str | None]:
    """The JSON form stored for ``value``, or (None, why it cannot be stored)."""
    try:
        text = canonical_json(value)
    except (TypeError, ValueError) as exc:
        return None, f"The result is not JSON serializable: {exc}"
    if len(text.encode()) > max_bytes:
        return None, (
            f"The result is {len(text.encode())} bytes of JSON, over "
            f"IDEMPOTENT_TASKS_MAX_RESULT_BYTES ({max_bytes})."
        )
    return json.loads(text), None


def release_lease(record: IdempotencyRecord, by: str, *, force: bool = False) -> bool:
    """Mark an IN_PROGRESS record FAILED so the next delivery reruns it; live leases need force."""
    now = timezone.now()
    held = records().filter(pk=record.pk, fence=record.fence, status=Status.IN_PROGRESS)
    if not force:
        held = held.filter(Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True))
    error = {
        "type": "LeaseReleased",
        "message": f"Lease released by {by} at {now.isoformat()}.",
        "traceback": "",
    }
    return bool(held.update(status=Status.FAILED, error=error, lease_expires_at=None, completed_at=now))


def fail_task(scope: str, key: str, task_id: str, error: dict[str, str]) -> bool:
    """Mark the key FAILED if the delivery ``task_id`` still holds it (its process was killed)."""
    now = timezone.now()
    return bool(
        records()
        .filter(scope=scope, key=key, task_id=task_id, status=Status.IN_PROGRESS)
        .update(status=Status.FAILED, error=error, lease_expires_at=None, completed_at=now)
    )


def purgeable(queryset: Any) -> Any:
    """``queryset`` without the IN_PROGRESS records whose lease is live: those are never purged."""
    return queryset.exclude(status=Status.IN_PROGRESS, lease_expires_at__gte=timezone.now())


def purge(queryset: Any, *, batch_size: int, progress: Any = None) -> int:
    """Delete the records of ``queryset`` in batches, one short transaction each; returns the count."""
    deleted, after = 0, None
    while True:
        page = purgeable(queryset).order_by("pk")
        if after is not None:
            # Walk forward by primary key: restarting from the top would rescan the dead rows of
            # the batches already deleted, which makes a long purge quadratic.
            page = page.filter(pk__gt=after)
        batch = list(page.values_list("pk", flat=True)[:batch_size])
        if not batch:
            return deleted
        after = batch[-1]
        # One DELETE that re-checks the filters and the lease: a delivery may have taken a record
        # over since the SELECT, and PostgreSQL re-evaluates the WHERE on the row it waited for.
        # QuerySet.delete() would, with any pre/post_delete receiver connected, select first and
        # then delete by pk only. Records have no reverse relations, so nothing cascades.
        current = purgeable(queryset.order_by().filter(pk__in=batch))
        deleted += current._raw_delete(current.db)
        if progress is not None:
            progress(deleted)
