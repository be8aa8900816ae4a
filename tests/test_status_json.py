"""idempotency_status --json: the exact objects it prints."""

from __future__ import annotations

import json
from typing import Any

import pytest

from django_idempotent_tasks import keys
from django_idempotent_tasks.locks import RedisLock, lock_client
from tests import records
from tests.running import run_command

pytestmark = pytest.mark.django_db
LOCK_SECONDS = 600


def test_the_counts_as_json(django_assert_num_queries: Any) -> None:
    records.expired("a", task_name="t1")
    records.make("b", "FAILED", task_name="t1")
    records.stuck("d", task_name="t2")
    # by task and status, stuck, expired from the expires_at index, the live leases among them
    with django_assert_num_queries(4):
        output = run_command("idempotency_status", "--json")
    assert output == (
        "{\n"
        '  "records": 3,\n'
        '  "by_status": {\n    "PENDING": 0,\n    "IN_PROGRESS": 1,\n    "SUCCEEDED": 1,\n    "FAILED": 1\n  },\n'
        '  "by_task": {\n'
        '    "t1": {\n      "PENDING": 0,\n      "IN_PROGRESS": 0,\n      "SUCCEEDED": 1,\n      "FAILED": 1\n    },\n'
        '    "t2": {\n      "PENDING": 0,\n      "IN_PROGRESS": 1,\n      "SUCCEEDED": 0,\n      "FAILED": 0\n    }\n'
        "  },\n"
        '  "stuck": 1,\n'
        '  "expired": 1,\n'
        '  "oldest_expired_at": "2020-01-01T00:00:00+00:00",\n'
        '  "overdue_pending": 0,\n'
        '  "redrive_after": 600,\n'
        '  "next_step": null\n'
        "}\n"
    )


def test_no_records_as_json() -> None:
    assert json.loads(run_command("idempotency_status", "--json")) == {
        "records": 0,
        "by_status": {"PENDING": 0, "IN_PROGRESS": 0, "SUCCEEDED": 0, "FAILED": 0},
        "by_task": {},
        "stuck": 0,
        "expired": 0,
        "oldest_expired_at": None,
        "overdue_pending": 0,
        "redrive_after": 600,
        "next_step": None,
    }


def test_the_overdue_pending_keys_as_json(settings: Any) -> None:
    settings.IDEMPOTENT_TASKS_REDRIVE_AFTER = 60
    records.pending("p-1", age=61)
    records.pending("p-2", age=1)
    data = json.loads(run_command("idempotency_status", "--json"))
    assert data["by_status"] == {"PENDING": 2, "IN_PROGRESS": 0, "SUCCEEDED": 0, "FAILED": 0}
    assert (data["overdue_pending"], data["redrive_after"]) == (1, 60)
    assert "redrive_idempotency_records" in data["next_step"]


def test_one_key_as_json_with_its_lock() -> None:
    lock = RedisLock(lock_client(), keys.lock_name("s", "order-1"), LOCK_SECONDS)
    assert lock.acquire()
    try:
        records.live(
            "order-1",
            attempts=2,
            fence=3,
            task_id="tid-1",
            created_at=records.PAST,
            started_at=records.PAST,
            expires_at=records.FUTURE,
            steps={"email": None, "charge": "ch_1"},
            error={"type": "RuntimeError", "message": "boom", "traceback": "..."},
        )
        data = json.loads(run_command("idempotency_status", "--json", "order-1"))
    finally:
        lock.release()
    assert data["lock"]["ttl_ms"] in range((LOCK_SECONDS - 5) * 1000, LOCK_SECONDS * 1000 + 1)
    assert data == {
        "scope": "s",
        "key": "order-1",
        "record": {
            "task_name": "tests.task",
            "status": "IN_PROGRESS",
            "attempts": 2,
            "fence": 3,
            "task_id": "tid-1",
            "worker": "host:1",
            "created_at": "2020-01-01T00:00:00+00:00",
            "started_at": "2020-01-01T00:00:00+00:00",
            "completed_at": None,
            "expires_at": "2999-01-01T00:00:00+00:00",
            "lease_expires_at": "2999-01-01T00:00:00+00:00",
            "result": None,
            "error": {"type": "RuntimeError", "message": "boom", "traceback": "..."},
            "steps": ["charge", "email"],
            "history": [],
        },
        "lock": {"held": True, "token": lock.token, "ttl_ms": data["lock"]["ttl_ms"], "error": None},
    }


def test_a_missing_key_as_json() -> None:
    assert json.loads(run_command("idempotency_status", "--json", "nope")) == {
        "scope": None,
        "key": "nope",
        "record": None,
        "lock": None,
    }
    assert json.loads(run_command("idempotency_status", "--json", "nope", "--scope", "s")) == {
        "scope": "s",
        "key": "nope",
        "record": None,
        "lock": {"held": False, "token": None, "ttl_ms": None, "error": None},
    }
