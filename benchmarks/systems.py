"""The systems compared, one task each; every body is a no-op or 5 ms of work plus a counted effect."""

from __future__ import annotations

import time
import uuid
from functools import cache
from typing import Any

import redis
from celery import shared_task
from celery_once import QueueOnce  # type: ignore[import-untyped]
from celery_singleton import Singleton  # type: ignore[import-untyped]

from benchmarks import settings
from django_idempotent_tasks.tasks import IdempotentTask

WORK_SECONDS = 0.005
NAIVE_TTL_MS = 60_000
DONE_TTL_SECONDS = 7 * 24 * 3600


@cache
def stats() -> redis.Redis:
    """Where bodies count their side effects (a Redis db no system uses)."""
    return redis.Redis.from_url(settings.STATS_REDIS_URL)


@cache
def peer_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.PEER_REDIS_URL)


def body(unit: str, work: bool) -> None:
    """The task's own work: nothing, or 5 ms and one side effect counted per unit of work."""
    if work:
        time.sleep(WORK_SECONDS)
        stats().hincrby("effects", unit, 1)


@shared_task(name="bench.plain")
def plain(unit: str, work: bool) -> None:
    body(unit, work)


@shared_task(name="bench.once", base=QueueOnce)
def once(unit: str, work: bool) -> None:
    body(unit, work)


@shared_task(name="bench.singleton", base=Singleton)
def singleton(unit: str, work: bool) -> None:
    body(unit, work)


@shared_task(name="bench.naive")
def naive(unit: str, work: bool, key: str) -> None:
    """The pattern people write first: a done marker and a SET NX lock, both in Redis."""
    client = peer_redis()
    if client.get(f"done:{key}"):
        return
    lock = f"lock:{key}"
    if not client.set(lock, uuid.uuid4().hex, nx=True, px=NAIVE_TTL_MS):
        return
    try:
        body(unit, work)
        client.set(f"done:{key}", 1, ex=DONE_TTL_SECONDS)
    finally:
        client.delete(lock)


@shared_task(name="bench.idempotent", base=IdempotentTask, bind=True)
def idempotent(self: Any, unit: str, work: bool) -> None:
    body(unit, work)


@shared_task(name="bench.idempotent_atomic", base=IdempotentTask, bind=True, atomic=True)
def idempotent_atomic(self: Any, unit: str, work: bool) -> None:
    body(unit, work)


@shared_task(name="bench.idempotent_raise", base=IdempotentTask, bind=True, on_conflict="raise")
def idempotent_raise(self: Any, unit: str, work: bool) -> None:
    body(unit, work)


@shared_task(name="bench.idempotent_outbox", base=IdempotentTask, bind=True, outbox=True)
def idempotent_outbox(self: Any, unit: str, work: bool) -> None:
    """IdempotentTask through the outbox: a PENDING record written at enqueue, claimed by an UPDATE."""
    body(unit, work)
