"""idempotency_status and release_idempotency_lock, with their exact output, on real Redis locks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from datetime import timezone as dt_timezone
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import CommandError, call_command

from django_idempotent_tasks import keys
from django_idempotent_tasks.locks import RedisLock, lock_client, worker_identity
from django_idempotent_tasks.management import key_state
from django_idempotent_tasks.models import IdempotencyRecord
from tests import records
from tests.helpers import REFUSED, redis_down
from tests.running import run_command as run

pytestmark = pytest.mark.django_db

LABEL = "key 'order-1' in scope 's'"


@pytest.fixture
def held() -> Iterator[RedisLock]:
    """The lock of 'order-1' in scope 's', held by this process for 600 s."""
    lock = RedisLock(lock_client(), keys.lock_name("s", "order-1"), 600)
    assert lock.acquire()
    yield lock


def lock_line(lock: RedisLock) -> set[str]:
    """The Redis lock line, for the TTL read just before or just after the command ran."""
    holder = f"held by {worker_identity()} (token {lock.token})"
    return {f"Redis lock: {holder}, expires in {seconds} s" for seconds in (600, 599)}


# idempotency_status


def test_status_counts_by_status_and_task(django_assert_num_queries: Any) -> None:
    records.expired("a", task_name="t1")
    records.make("b", "FAILED", task_name="t1", expires_at=datetime(2021, 6, 1, tzinfo=dt_timezone.utc))
    records.make("c", "FAILED", task_name="t1")
    records.stuck("d", task_name="t2")
    records.live("e", task_name="t2", expires_at=datetime(2019, 1, 1, tzinfo=dt_timezone.utc))
    # by task and status, stuck, expired from the expires_at index, the live leases among them,
    # and as one of them is live the oldest of the others
    with django_assert_num_queries(5):
        output = run("idempotency_status")
    assert output == (
        "Records: 5\n"
        "  PENDING: 0\n"
        "  IN_PROGRESS: 2\n"
        "  SUCCEEDED: 1\n"
        "  FAILED: 2\n"
        "By task:\n"
        "  t1: 3 (0 PENDING, 0 IN_PROGRESS, 1 SUCCEEDED, 2 FAILED)\n"
        "  t2: 2 (0 PENDING, 2 IN_PROGRESS, 0 SUCCEEDED, 0 FAILED)\n"
        "Stuck leases (IN_PROGRESS, lease expired): 1\n"
        "Expired records (purgeable): 2, the oldest expired at 2020-01-01 00:00:00 UTC\n"
        "Overdue PENDING keys (older than the re-drive age, 600 s): 0\n"
    )


def test_status_without_records(django_assert_num_queries: Any) -> None:
    with django_assert_num_queries(1):
        assert run("idempotency_status") == "No idempotency records.\n"
    records.make("a")
    assert run("idempotency_status").endswith(
        "Stuck leases (IN_PROGRESS, lease expired): 0\nExpired records (purgeable): 0\n"
        "Overdue PENDING keys (older than the re-drive age, 600 s): 0\n"
    )


def test_status_counts_the_pending_keys_older_than_the_redrive_age(
    django_assert_num_queries: Any, settings: Any
) -> None:
    settings.IDEMPOTENT_TASKS_REDRIVE_AFTER = 300
    records.pending("p-1", age=301)
    records.pending("p-2", age=3600)
    records.pending("p-3", age=5)  # sent a moment ago: not overdue
    # by task and status, stuck, expired from the expires_at index, the live leases among them, the
    # overdue PENDING records (asked only when there are PENDING records)
    with django_assert_num_queries(5):
        output = run("idempotency_status")
    assert output.endswith(
        "Overdue PENDING keys (older than the re-drive age, 300 s): 2\n"
        "  Their messages were lost or are late: run `python manage.py redrive_idempotency_records` to "
        "send them again, and check that the beat schedule runs "
        "django_idempotent_tasks.redrive_pending_records (`manage.py check --deploy` warns when it does "
        "not).\n"
    )
    assert "  PENDING: 3\n" in output
    assert "  tests.task: 3 (3 PENDING, 0 IN_PROGRESS, 0 SUCCEEDED, 0 FAILED)\n" in output


def test_status_of_a_key_shows_record_lease_and_lock(held: RedisLock, django_assert_num_queries: Any) -> None:
    records.live(
        "order-1",
        attempts=2,
        fence=3,
        task_id="tid-1",
        created_at=records.PAST,
        started_at=records.PAST,
        expires_at=records.FUTURE,
        steps={"charge": "ch_1", "email": None},
        error={"type": "RuntimeError", "message": "boom", "traceback": "..."},
    )
    with django_assert_num_queries(2):  # the scopes in use, then the key in each of them
        lines = run("idempotency_status", "order-1").splitlines()
    assert lines[:-1] == [
        f"Record of {LABEL}",
        "  Task: tests.task",
        "  Status: IN_PROGRESS",
        "  Attempts: 2, fence: 3",
        "  Task id: tid-1",
        "  Worker: host:1",
        "  Created at: 2020-01-01 00:00:00 UTC",
        "  Started at: 2020-01-01 00:00:00 UTC",
        "  Completed at: -",
        "  Expires at: 2999-01-01 00:00:00 UTC",
        "  Lease: live until 2999-01-01 00:00:00 UTC (held by host:1, fence 3)",
        "  Result: null",
        "  Error: RuntimeError: boom",
        "  Steps: charge, email",
        "  History: -",
    ]
    assert lines[-1] in lock_line(held)


def test_status_of_finished_and_stuck_records() -> None:
    records.make("order-1", result={"text": "x" * 300}, completed_at=records.PAST)
    records.stuck("stuck-1")
    records.make("odd-1", "IN_PROGRESS")
    lines = run("idempotency_status", "order-1").splitlines()
    assert lines[10:15] == [
        "  Lease: none",
        f'  Result: {{"text": "{"x" * 190}… (312 characters)',
        "  Error: -",
        "  Steps: -",
        "  History: -",
    ]
    assert lines[-1] == "Redis lock: not held"
    assert "  Lease: expired at 2020-01-01 00:00:00 UTC: stuck" in run("idempotency_status", "stuck-1")
    assert "  Lease: none, yet the record is IN_PROGRESS: stuck" in run("idempotency_status", "odd-1")


def test_status_of_a_key_without_record(held: RedisLock) -> None:
    assert run("idempotency_status", "order-1") == (
        "No record with key 'order-1' in any scope. Pass --scope to see its Redis lock.\n"
    )
    lines = run("idempotency_status", "order-1", "--scope", "s").splitlines()
    assert lines[0] == f"No record for {LABEL}."
    assert lines[1] in lock_line(held)


def test_status_of_a_key_in_several_scopes_needs_scope() -> None:
    records.make("order-1", scope="b")
    records.make("order-1", scope="a")
    with pytest.raises(CommandError) as raised:
        run("idempotency_status", "order-1")
    assert str(raised.value) == "The key 'order-1' exists in several scopes ('a', 'b'): pass --scope."
    assert run("idempotency_status", "order-1", "--scope", "b").startswith(
        "Record of key 'order-1' in scope 'b'\n"
    )


def test_status_when_redis_does_not_answer() -> None:
    records.make("order-1")
    with redis_down():
        output = run("idempotency_status", "order-1")
    assert output.endswith(f"Redis lock: unknown: Redis did not answer ({REFUSED})\n")


# release_idempotency_lock


def test_release_frees_a_stuck_lease_and_its_lock(held: RedisLock, lock_redis: redis.Redis) -> None:
    records.stuck("order-1", fence=4)
    assert run("release_idempotency_lock", "order-1") == (
        f"Released the expired lease of {LABEL} (fence 4, worker host:1): the record is FAILED now "
        "and the next delivery runs the task again.\n"
        f"Released the Redis lock of {LABEL}, held by {worker_identity()} (token {held.token}).\n"
    )
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.fence, record.lease_expires_at) == ("FAILED", 4, None)
    assert record.error is not None and record.error["type"] == "LeaseReleased"
    assert record.error["message"].startswith(
        f"Lease released by release_idempotency_lock on {worker_identity()} at "
    )
    assert lock_redis.exists(held.name) == 0


def test_release_refuses_a_live_lease(held: RedisLock, lock_redis: redis.Redis) -> None:
    records.live("order-1", fence=2)
    with pytest.raises(CommandError) as raised:
        run("release_idempotency_lock", "order-1", "--scope", "s")
    assert str(raised.value) == (
        f"The lease of {LABEL} is live until 2999-01-01 00:00:00 UTC (held by host:1, fence 2): refusing "
        "to release it. Wait for it to expire, or pass --force if that worker is gone. Nothing was changed."
    )
    assert IdempotencyRecord.objects.get().status == "IN_PROGRESS"
    assert lock_redis.get(held.name) == held.token.encode()


def test_release_force_frees_a_live_lease(held: RedisLock, lock_redis: redis.Redis) -> None:
    records.live("order-1", fence=2)
    assert run("release_idempotency_lock", "order-1", "--force") == (
        f"Released the live lease of {LABEL} (fence 2, worker host:1): the record is FAILED now "
        "and the next delivery runs the task again.\n"
        f"Released the Redis lock of {LABEL}, held by {worker_identity()} (token {held.token}).\n"
    )
    assert IdempotencyRecord.objects.get().status == "FAILED"
    assert lock_redis.exists(held.name) == 0


def test_release_a_lock_left_behind_by_a_finished_record(held: RedisLock, lock_redis: redis.Redis) -> None:
    records.make("order-1")
    assert run("release_idempotency_lock", "order-1") == (
        f"The record of {LABEL} is SUCCEEDED: no lease to release.\n"
        f"Released the Redis lock of {LABEL}, held by {worker_identity()} (token {held.token}).\n"
    )
    assert IdempotencyRecord.objects.get().status == "SUCCEEDED"
    assert lock_redis.exists(held.name) == 0


def test_release_without_record() -> None:
    assert run("release_idempotency_lock", "order-1", "--scope", "s") == (
        f"No record for {LABEL}: no lease to release.\nThe Redis lock of {LABEL} was not held.\n"
    )
    with pytest.raises(CommandError) as raised:
        run("release_idempotency_lock", "order-1")
    assert str(raised.value) == (
        "No record with key 'order-1' in any scope. Pass --scope to release its Redis lock."
    )


def test_release_is_silent_at_verbosity_0(held: RedisLock, lock_redis: redis.Redis) -> None:
    records.stuck("order-1")
    assert run("release_idempotency_lock", "order-1", "--verbosity", "0") == ""
    assert IdempotencyRecord.objects.get().status == "FAILED"
    assert lock_redis.exists(held.name) == 0


def test_release_reports_the_lease_before_a_redis_failure() -> None:
    records.stuck("order-1")
    out = StringIO()
    with redis_down(), pytest.raises(CommandError) as raised:
        call_command("release_idempotency_lock", "order-1", stdout=out)
    assert out.getvalue().startswith(f"Released the expired lease of {LABEL} (fence 1, worker host:1)")
    assert str(raised.value) == f"Could not read the Redis lock of {LABEL}: {REFUSED}."
    assert IdempotencyRecord.objects.get().status == "FAILED"


def test_release_refuses_when_the_record_moved_on_meanwhile() -> None:
    from django_idempotent_tasks.management.commands.release_idempotency_lock import Command

    seen = records.stuck("order-1")
    IdempotencyRecord.objects.filter(pk=seen.pk).update(fence=2)  # another delivery claimed it and died
    with pytest.raises(CommandError) as raised:
        Command()._release_lease(LABEL, seen, force=False)
    assert str(raised.value) == (
        f"The record of {LABEL} changed while its lease was being released (another delivery moved it on): "
        "nothing was released. Run the command again."
    )
    assert IdempotencyRecord.objects.get().status == "IN_PROGRESS"


def test_release_leaves_a_lock_that_changed_hands_after_it_was_read(
    held: RedisLock, lock_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = key_state.lock_state

    def read_then_lose(scope: str, key: str) -> key_state.LockState:
        state = read(scope, key)
        lock_redis.set(held.name, "worker-9.example.internal:777:other")  # it expired; another took it
        return state

    monkeypatch.setattr(key_state, "lock_state", read_then_lose)
    assert run("release_idempotency_lock", "order-1", "--scope", "s") == (
        f"No record for {LABEL}: no lease to release.\n"
        f"The Redis lock of {LABEL} changed hands while being released: left as it is.\n"
    )
    assert lock_redis.get(held.name) == b"worker-9.example.internal:777:other"


def test_release_reports_a_redis_failure_after_the_lock_was_read(
    held: RedisLock, lock_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = key_state.lock_state
    outage = contextlib.ExitStack()

    def read_then_redis_goes_down(scope: str, key: str) -> key_state.LockState:
        state = read(scope, key)
        outage.enter_context(redis_down())
        return state

    monkeypatch.setattr(key_state, "lock_state", read_then_redis_goes_down)
    with outage, pytest.raises(CommandError) as raised:
        run("release_idempotency_lock", "order-1", "--scope", "s")
    assert str(raised.value) == f"Could not release the Redis lock of {LABEL}: {REFUSED}."
    assert lock_redis.get(held.name) == held.token.encode()
