"""Leases on the database clock: real prefork workers whose clocks are 300 s off (libfaketime)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import Worker, replayed_on, wait_for
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = [
    pytest.mark.workers,
    # SQLite has no server: its 'now' is the clock of the process that asks, so a skewed process
    # skews the database clock with it. Its processes share one host and so one real clock.
    pytest.mark.skipif(
        settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"),
        reason="SQLite's clock is each process's own clock: skew between processes needs a database server",
    ),
]

FAKETIME_LIBRARY = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
SKEW = "300s"
BODY_SECONDS = 8  # long enough to flush the lock Redis and hand the duplicate to the other worker
WAIT = 120


def skewed(env: dict[str, str], offset: str) -> dict[str, str]:
    """The environment of a worker whose clock is ``offset`` off (never given to redis-server)."""
    assert Path(FAKETIME_LIBRARY).exists(), "install Debian's faketime package (scripts/system_deps.sh)"
    return {**env, "LD_PRELOAD": FAKETIME_LIBRARY, "FAKETIME": offset, "FAKETIME_DONT_RESET": "1"}


@pytest.fixture
def clock_workers(worker_env: dict[str, str], transactional_db: None) -> Iterator[dict[str, Worker]]:
    """A worker on the true clock (queue ``clock_true``), one 300 s ahead and one 300 s behind."""
    started: dict[str, Worker] = {}
    layout = {
        "true": worker_env,
        "ahead": skewed(worker_env, f"+{SKEW}"),
        "behind": skewed(worker_env, f"-{SKEW}"),
    }
    try:
        for name, env in layout.items():
            started[name] = Worker(f"clock-{name}", env, concurrency=1, extra=("-Q", f"clock_{name}")).start()
        yield started
    finally:
        for worker in started.values():
            worker.stop()


def run_then_duplicate(holder: str, duplicate: str, key: str, lock_redis: redis.Redis) -> IdempotencyRecord:
    """Start the body on ``holder``, flush the lock Redis, send the duplicate to ``duplicate``."""
    tasks.record_effect.apply_async((1, BODY_SECONDS), {"idempotency_key": key}, queue=f"clock_{holder}")
    wait_for(lambda: Effect.objects.filter(key=key).exists(), timeout=WAIT, what="the first body to run")
    lock_redis.flushdb()
    tasks.record_effect.apply_async((1, BODY_SECONDS), {"idempotency_key": key}, queue=f"clock_{duplicate}")
    done: IdempotencyRecord = wait_for(
        lambda: IdempotencyRecord.objects.filter(key=key, status="SUCCEEDED").first(),
        timeout=WAIT,
        what=f"{key} to succeed",
    )
    return done


def replayed(worker: Worker, key: str) -> bool:
    return f"{worker.name}@" in {name.split("@")[0] + "@" for name in replayed_on(key)}


def test_a_worker_300_s_ahead_does_not_take_over_a_live_lease(
    clock_workers: dict[str, Worker], lock_redis: redis.Redis
) -> None:
    done = run_then_duplicate("true", "ahead", "c1", lock_redis)
    wait_for(lambda: replayed(clock_workers["ahead"], "c1"), timeout=WAIT, what="the duplicate to replay")
    assert Effect.objects.filter(key="c1").count() == 1
    assert (done.fence, done.attempts) == (1, 1)


def test_a_holder_300_s_behind_keeps_its_lease(
    clock_workers: dict[str, Worker], lock_redis: redis.Redis
) -> None:
    done = run_then_duplicate("behind", "true", "c2", lock_redis)
    wait_for(lambda: replayed(clock_workers["true"], "c2"), timeout=WAIT, what="the duplicate to replay")
    assert Effect.objects.filter(key="c2").count() == 1
    assert (done.fence, done.attempts) == (1, 1)
