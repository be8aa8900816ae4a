"""idempotency_status KEY shows the attempts; --stuck lists the stuck keys with the next step."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_idempotent_tasks import store
from django_idempotent_tasks.management import stuck_keys
from django_idempotent_tasks.models import IdempotencyRecord
from tests import records

pytestmark = pytest.mark.django_db
LEASE = {"lease_seconds": 60, "record_ttl": 60}


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def _killed_then_recovered() -> IdempotencyRecord:
    """Attempt 1 on host:1 died mid-body; attempt 2 on host:2 took over and completed."""
    store.insert(
        "s", "order-44", task_name="tests.task", fingerprint="f" * 64, task_id="t1", worker="host:1", **LEASE
    )
    IdempotencyRecord.objects.filter(key="order-44").update(lease_expires_at=records.PAST)
    snapshot = store.lookup("s", "order-44")
    assert snapshot is not None
    claim = store.take_over(snapshot, task_id="t2", worker="host:2", **LEASE)
    assert claim is not None
    assert store.complete(claim, {"charged": 1}, None, 60)
    return IdempotencyRecord.objects.get(key="order-44")


def test_status_of_a_key_tells_its_attempts() -> None:
    record = _killed_then_recovered()
    lines = run("idempotency_status", "order-44").splitlines()
    first, second = (
        record.attempts_log[0]["at"][:19].replace("T", " "),
        record.attempts_log[1]["at"][:19].replace("T", " "),
    )
    history = lines[lines.index("  History:") + 1 : -1]
    assert [line.split(" after ")[0].split(" died mid-body")[0] for line in history] == [
        "    attempt 1 on host:1",
        "    attempt 2 on host:2 recovered and completed",
    ]
    assert history[0].startswith("    attempt 1 on host:1 died mid-body and was taken over ")
    assert history[0].endswith(f" s after it began (task t1, began {first} UTC)")
    assert history[1].endswith(f" s (task t2, began {second} UTC)")


def test_status_json_of_a_key_tells_its_attempts() -> None:
    _killed_then_recovered()
    data = json.loads(run("idempotency_status", "order-44", "--json"))
    attempts = data["record"]["history"]
    assert [(a["attempt"], a["worker"], a["task_id"], a["ending"], a["recovered"]) for a in attempts] == [
        (1, "host:1", "t1", "taken_over", False),
        (2, "host:2", "t2", "completed", True),
    ]
    assert attempts[0]["ended_at"] == attempts[1]["claimed_at"]
    assert attempts[1]["summary"].startswith("attempt 2 on host:2 recovered and completed after ")


def test_stuck_lists_the_keys_oldest_first_with_the_next_step(django_assert_num_queries: Any) -> None:
    records.stuck(
        "order-2", worker="host:2", task_id="t2", lease_expires_at=records.FUTURE.replace(year=2021)
    )
    records.stuck("it's 3", worker="host:3", task_id="t3")
    records.live("running")
    records.make("done")
    with django_assert_num_queries(1):
        output = run("idempotency_status", "--stuck")
    assert output.splitlines() == [
        "Stuck keys (IN_PROGRESS, lease expired): 2",
        "  key \"it's 3\" in scope 's' (tests.task)",
        "    Held by host:3 (task t3, attempt 1, fence 1); expired at 2020-01-01 00:00:00 UTC: stuck",
        "    Next step: python manage.py release_idempotency_lock 'it'\"'\"'s 3' --scope s",
        "  key 'order-2' in scope 's' (tests.task)",
        "    Held by host:2 (task t2, attempt 1, fence 1); expired at 2021-01-01 00:00:00 UTC: stuck",
        "    Next step: python manage.py release_idempotency_lock order-2 --scope s",
        stuck_keys.WAIT_NOTE,
        stuck_keys.BROKER_NOTE,
    ]
    assert "A broker may still hold the message" in stuck_keys.BROKER_NOTE


def test_stuck_counts_past_the_limit() -> None:
    for n in range(3):
        records.stuck(f"k{n}")
    lines = run("idempotency_status", "--stuck", "--limit", "2").splitlines()
    assert lines[0] == "Stuck keys (IN_PROGRESS, lease expired): 3, the oldest 2"
    assert [line for line in lines if line.startswith("  key")] == [
        "  key 'k0' in scope 's' (tests.task)",
        "  key 'k1' in scope 's' (tests.task)",
    ]


def test_stuck_as_json_and_when_there_are_none() -> None:
    assert run("idempotency_status", "--stuck") == "No stuck keys.\n"
    records.stuck("order-2", task_id="t2")
    assert json.loads(run("idempotency_status", "--stuck", "--json")) == {
        "stuck": 1,
        "keys": [
            {
                "scope": "s",
                "key": "order-2",
                "task_name": "tests.task",
                "worker": "host:1",
                "task_id": "t2",
                "attempts": 1,
                "fence": 1,
                "lease_expires_at": "2020-01-01T00:00:00+00:00",
                "next_step": "python manage.py release_idempotency_lock order-2 --scope s",
            }
        ],
        "notes": [stuck_keys.WAIT_NOTE, stuck_keys.BROKER_NOTE],
    }


def test_stuck_and_a_key_do_not_mix() -> None:
    with pytest.raises(CommandError, match="Pass either a key or --stuck, not both."):
        run("idempotency_status", "k", "--stuck")
