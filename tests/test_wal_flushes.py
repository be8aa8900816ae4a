"""An atomic task's first execution waits for one WAL flush on PostgreSQL, not two, and the claim
that makes it so never changes the durability of anyone else's transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from django_idempotent_tasks.models import IdempotencyRecord
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="pg_stat_wal and synchronous_commit"),
]

# pg_stat_wal is the whole server's: the WAL writer or autovacuum can only add, so take the least
# of several one-call windows.
WINDOWS = 8


def wal_syncs() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # a backend reports at most once a second
        cursor.execute("SELECT wal_sync FROM pg_stat_wal")
        return int(cursor.fetchone()[0])


def fewest_syncs(call: Callable[[int], Any]) -> int:
    deltas = []
    for number in range(WINDOWS):
        before = wal_syncs()
        call(number)
        deltas.append(wal_syncs() - before)
    return min(deltas)


def synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


def run(task: Any, key: str) -> Any:
    return task.apply(("v",), {"idempotency_key": key}, throw=True).get()


def test_an_atomic_first_execution_waits_for_one_wal_flush() -> None:
    assert fewest_syncs(lambda n: run(tasks.atomic_effect, f"atomic-{n}")) == 1
    # Its claim and its body's write are both there, durable with the completion's flush.
    assert IdempotencyRecord.objects.filter(key__startswith="atomic-", status="SUCCEEDED").count() == WINDOWS
    assert Effect.objects.count() == WINDOWS
    assert synchronous_commit() == "on"  # the claim's setting ended with its own transaction


def test_a_non_atomic_first_execution_flushes_its_claim_before_the_body_runs() -> None:
    # The next holder must find the claim after any crash, to be told it is recovering: the claim,
    # the body's own write (autocommit) and the completion each wait for their flush.
    assert fewest_syncs(lambda n: run(tasks.record_effect, f"plain-{n}")) == 3


def test_a_claim_inside_the_callers_transaction_keeps_that_transaction_durable() -> None:
    with transaction.atomic():
        run(tasks.atomic_effect, "inside")
        assert synchronous_commit() == "on"
    assert IdempotencyRecord.objects.get(key="inside").status == "SUCCEEDED"
