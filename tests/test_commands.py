"""The operator commands, with their exact output: purge, status and release."""

from __future__ import annotations

import threading
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError
from django.db import connection, transaction
from django.utils import timezone

from django_idempotent_tasks import purging, store
from django_idempotent_tasks.models import IdempotencyRecord
from tests import records
from tests.helpers import wait_for
from tests.running import run_command as run

pytestmark = pytest.mark.django_db


class TTY(StringIO):
    """Captured output that says it is a terminal, as a person's shell is."""

    def isatty(self) -> bool:
        return True


# purge_idempotency_records


def test_purge_deletes_expired_records_and_keeps_live_leases(django_assert_num_queries: Any) -> None:
    records.expired("done")
    records.expired("failed", "FAILED")
    records.expired("stuck", "IN_PROGRESS", lease_expires_at=records.PAST)
    records.expired("live", "IN_PROGRESS", lease_expires_at=records.FUTURE)
    records.make("fresh")
    # each batch reads its last record, then deletes up to it: a full batch, the rest (no record at
    # a batch's end), then the same for the records without expiry (none)
    with django_assert_num_queries(6):
        assert run("purge_idempotency_records", "--batch-size", "2") == "Deleted 3 records.\n"
    assert records.keys() == ["fresh", "live"]


def test_purge_counts_with_thousands_separators(django_assert_num_queries: Any) -> None:
    IdempotencyRecord.objects.bulk_create(
        IdempotencyRecord(scope="s", key=f"k{n}", task_name="t", fingerprint="f", expires_at=records.PAST)
        for n in range(1234)
    )
    with django_assert_num_queries(8):  # three batches, the last one short, then none without expiry
        assert run("purge_idempotency_records", "--batch-size", "500") == "Deleted 1,234 records.\n"
    assert records.keys() == []


def test_purge_dry_run_counts_and_deletes_nothing(django_assert_num_queries: Any) -> None:
    records.expired("a")
    records.expired("b")
    records.expired("live", "IN_PROGRESS", lease_expires_at=records.FUTURE)
    with django_assert_num_queries(1):
        assert run("purge_idempotency_records", "--dry-run") == "Would delete 2 records.\n"
    assert records.keys() == ["a", "b", "live"]


def test_purge_says_one_record_and_no_records() -> None:
    records.expired("a")
    assert run("purge_idempotency_records", "--dry-run") == "Would delete 1 record.\n"
    assert run("purge_idempotency_records") == "Deleted 1 record.\n"
    assert run("purge_idempotency_records") == "No records to delete.\n"
    assert run("purge_idempotency_records", "--dry-run") == "No records to delete.\n"


def test_purge_older_than_ignores_expiry_but_never_a_live_lease() -> None:
    old = timezone.now() - timedelta(days=8)
    records.make("old", created_at=old)
    records.live("old-live", created_at=old)
    records.make("recent", created_at=timezone.now() - timedelta(days=6))
    records.expired("recent-expired")
    assert run("purge_idempotency_records", "--older-than", "7d") == "Deleted 1 record.\n"
    assert records.keys() == ["old-live", "recent", "recent-expired"]
    assert run("purge_idempotency_records", "--older-than", "7d") == "No records to delete.\n"
    assert run("purge_idempotency_records", "--older-than", "30m", "--dry-run") == "Would delete 1 record.\n"
    assert run("purge_idempotency_records", "--older-than", "12h") == "Deleted 1 record.\n"
    assert records.keys() == ["old-live", "recent-expired"]


def test_purge_filters_by_status_and_task() -> None:
    records.expired("a-done", task_name="a")
    records.expired("a-failed", "FAILED", task_name="a")
    records.expired("b-failed", "FAILED", task_name="b")
    records.expired("b-live", "IN_PROGRESS", task_name="b", lease_expires_at=records.FUTURE)
    assert run("purge_idempotency_records", "--status", "failed", "--task", "a") == "Deleted 1 record.\n"
    assert run("purge_idempotency_records", "--status", "IN_PROGRESS") == "No records to delete.\n"
    assert run("purge_idempotency_records", "--task", "b") == "Deleted 1 record.\n"
    assert records.keys() == ["a-done", "b-live"]


def test_purge_shows_progress_only_on_a_terminal() -> None:
    for key in "abc":
        records.expired(key)
    output = run("purge_idempotency_records", "--batch-size", "2", stdout=TTY())
    assert output == ("\rDeleted 2 of 3 records…\rDeleted 3 of 3 records…\nDeleted 3 records.\n")


def test_purge_is_silent_at_verbosity_0() -> None:
    records.expired("a")
    assert run("purge_idempotency_records", "--verbosity", "0", stdout=TTY()) == ""
    assert records.keys() == []


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--older-than", "7x", "argument --older-than: '7x' is not a duration such as 7d, 12h or 30m."),
        ("--older-than", "0d", "argument --older-than: '0d' is not a duration such as 7d, 12h or 30m."),
        ("--batch-size", "0", "argument --batch-size: '0' is not a positive integer."),
        ("--batch-size", "ten", "argument --batch-size: 'ten' is not a positive integer."),
        (
            "--status",
            "DONE",
            "argument --status: 'DONE' is not a status; choose from IN_PROGRESS, SUCCEEDED, FAILED.",
        ),
        (
            "--status",
            "pending",
            "argument --status: PENDING records are never purged: the re-drive sends them "
            "(redrive_idempotency_records); choose from IN_PROGRESS, SUCCEEDED, FAILED.",
        ),
        ("--task", " ", "argument --task: must not be empty."),
    ],
)
def test_purge_rejects_bad_options(option: str, value: str, message: str) -> None:
    records.expired("a")
    with pytest.raises(CommandError) as raised:
        run("purge_idempotency_records", option, value)
    assert str(raised.value) == f"Error: {message}"
    assert records.keys() == ["a"]


# The DELETEs waiting for a row lock, as each server reports them.
WAITING_DELETES = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE%%'",
    # MariaDB does not always list the waiting statement's transaction in INNODB_TRX; a DELETE of
    # this two-row table that is still running is waiting for the lock.
    "mysql": "SELECT count(*) FROM information_schema.PROCESSLIST "
    "WHERE DB = DATABASE() AND INFO LIKE 'DELETE%%' AND ID <> CONNECTION_ID()",
}


def signal_delete(event: threading.Event) -> Any:
    """An execute wrapper that sets ``event`` as a DELETE is sent."""

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith("DELETE"):
            event.set()
        return execute(sql, params, many, context)

    return wrapper


@pytest.mark.django_db(transaction=True)
def test_purge_spares_a_record_taken_over_while_it_waited() -> None:
    """A delivery takes a stuck, expired record over between purge's SELECT and its DELETE."""
    taken = records.expired("taken", "IN_PROGRESS", lease_expires_at=records.PAST)
    records.expired("gone")
    locked, release = threading.Event(), threading.Event()

    def take_over() -> None:
        try:
            with transaction.atomic():
                claim = store.take_over(
                    taken, task_id="t2", worker="host:2", lease_seconds=600, record_ttl=3600
                )
                assert claim is not None
                locked.set()
                release.wait(60)
        finally:
            connection.close()

    taker = threading.Thread(target=take_over)
    taker.start()
    assert locked.wait(60)
    outcome: list[int] = []
    deleting = threading.Event()

    def purge() -> None:
        try:
            with connection.execute_wrapper(signal_delete(deleting)):
                outcome.append(purging.purge(store.records().expired(), batch_size=10))
        finally:
            connection.close()

    purger = threading.Thread(target=purge)
    purger.start()
    with connection.cursor() as cursor:

        def purge_waits() -> bool:
            if connection.vendor not in WAITING_DELETES:
                # SQLite locks the whole file, so the DELETE waits in its busy handler, out of sight.
                return deleting.is_set()
            cursor.execute(WAITING_DELETES[connection.vendor])
            return bool(cursor.fetchone()[0])

        wait_for(purge_waits, timeout=60, what="the purge's DELETE to wait for the row lock")
    release.set()
    taker.join(60)
    purger.join(60)
    assert outcome == [1]
    assert records.keys() == ["taken"]
    assert IdempotencyRecord.objects.get().fence == 2
