"""Reading a key's record and Redis lock for the operator commands."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from django.core.management.base import CommandError
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Count, Min
from redis.exceptions import RedisError

from django_idempotent_tasks import keys, store
from django_idempotent_tasks.locks import RedisLock, lock_client, lock_holder
from django_idempotent_tasks.models import DatabaseNow, IdempotencyRecord


def when(value: datetime | None) -> str:
    """A timestamp as the commands print it (UTC, to the second), or '-'."""
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def label(scope: str, key: str) -> str:
    """How the commands name a scoped key."""
    return f"key {key!r} in scope {scope!r}"


def find_record(key: str, scope: str | None) -> IdempotencyRecord | None:
    """The record of ``key`` (in ``scope`` if given); a key found in several scopes needs --scope."""
    # Without a scope, every scope in use is named: the (scope, key) index cannot find a key alone.
    found = store.records().with_key(key) if scope is None else store.records().filter(scope=scope, key=key)
    matches = list(found.order_by("scope")[:10])
    if len(matches) > 1:
        scopes = ", ".join(repr(record.scope) for record in matches)
        raise CommandError(f"The key {key!r} exists in several scopes ({scopes}): pass --scope.")
    return matches[0] if matches else None


def expired_summary() -> dict[str, Any]:
    """How many records a purge would delete (``n``) and the oldest one's expiry (``oldest``)."""
    past = store.records().filter(expires_at__lt=DatabaseNow())
    # expired() read from the expires_at index alone, less the few records a purge keeps among
    # those rows (live leases, PENDING): one query filtering on status and lease as well reads
    # every row of a large table on MariaDB.
    summary: dict[str, Any] = past.aggregate(n=Count("pk"), oldest=Min("expires_at"))
    kept = (past.live() | past.filter(status=IdempotencyRecord.Status.PENDING)).count()
    if kept:
        summary["n"] -= kept
        # The first by the index, not MIN(): MariaDB computed MIN() over every expired row (1–2 s).
        summary["oldest"] = (
            store.records().expired().order_by("expires_at").values_list("expires_at", flat=True).first()
        )
    return summary


@dataclass(frozen=True)
class LockState:
    """What Redis says about a key's lock."""

    token: str | None
    ttl_ms: int | None = None
    error: str | None = None

    def describe(self) -> str:
        """The state in words: who holds the lock and for how long, or why it is unknown."""
        if self.error is not None:
            return f"unknown: Redis did not answer ({self.error})"
        if self.token is None:
            return "not held"
        expiry = (
            "no expiry"
            if self.ttl_ms is None or self.ttl_ms < 0
            else f"expires in {-(-self.ttl_ms // 1000)} s"
        )
        return f"held by {self.describe_holder()}, {expiry}"

    def describe_holder(self) -> str:
        """The holder's hostname:pid (the token's prefix) and the token itself."""
        token = self.token or ""
        return f"{token.rsplit(':', 1)[0]} (token {token})"


def lock_state(scope: str, key: str) -> LockState:
    """Who holds the Redis lock of a scoped key, read without changing it."""
    name = keys.lock_name(scope, key)
    try:
        client = lock_client()
        token = lock_holder(client, name)
        ttl = client.pttl(name) if token is not None else None
    except RedisError as exc:
        return LockState(None, error=str(exc).rstrip(".") or type(exc).__name__)
    return LockState(token, ttl)


def lease(record: IdempotencyRecord) -> str:
    """The lease of a record, in words."""
    if record.lease_is_live:
        return f"live until {when(record.lease_expires_at)} (held by {record.worker}, fence {record.fence})"
    if record.status == IdempotencyRecord.Status.IN_PROGRESS:
        if record.lease_expires_at is None:
            return "none, yet the record is IN_PROGRESS: stuck"
        return f"expired at {when(record.lease_expires_at)}: stuck"
    return "none"


def short_json(value: Any, limit: int = 200) -> str:
    """A JSON value on one line, cut at ``limit`` characters."""
    text = json.dumps(value, cls=DjangoJSONEncoder, sort_keys=True)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def release_lock(scope: str, key: str, token: str) -> bool:
    """Delete the Redis lock of a scoped key if ``token`` still holds it (compare-and-delete)."""
    lock = RedisLock(lock_client(), keys.lock_name(scope, key), 1)
    lock.token = token  # act as the holder we saw, so a lock taken since is left alone
    return lock.release()
