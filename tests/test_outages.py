"""A records' database that stays unreachable is said out loud: an ERROR and a counter, once per lease."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.db.utils import OperationalError

from django_idempotent_tasks import outages
from django_idempotent_tasks.delivery import Delivery
from tests.helpers import SETTLE_TIMEOUT, Worker, wait_for
from tests.outage_app import MARK
from tests.testapp import tasks

QUEUE = "outage"


def json_lines(worker: Worker) -> list[dict[str, Any]]:
    return [json.loads(line.split(MARK, 1)[1]) for line in worker.output().splitlines() if MARK in line]


@pytest.fixture
def gone_database_worker(worker_env: dict[str, str]) -> Iterator[tuple[Worker, str]]:
    """A worker of the test app whose database does not exist, consuming its own queue."""
    name = f"idem_gone_{uuid.uuid4().hex[:8]}"
    env = {**worker_env, "IDEMPOTENT_TESTS_DATABASE_NAME": name}
    worker = Worker("gone", env, concurrency=1, app="tests.outage_app", extra=("-Q", QUEUE)).start()
    try:
        yield worker, name
    finally:
        worker.stop()


@pytest.mark.workers
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite creates a missing database file")
def test_a_worker_whose_database_does_not_exist_logs_an_error_and_counts_it(
    gone_database_worker: tuple[Worker, str],
) -> None:
    worker, name = gone_database_worker
    tasks.short_lease.apply_async((1,), {"idempotency_key": "gone"}, queue=QUEUE)  # lease: 2 s

    def error() -> dict[str, Any] | None:
        return next((line for line in json_lines(worker) if line.get("level") == "ERROR"), None)

    found = wait_for(error, timeout=SETTLE_TIMEOUT, what="the ERROR of an unreachable database")
    assert found["logger"] == "django_idempotent_tasks"
    assert found["database_alias"] == "default"
    assert name in found["database_error"]  # the driver's own message names the missing database
    assert found["unreachable_seconds"] >= 2
    counted = wait_for(lambda: [line for line in json_lines(worker) if "counter" in line], what="the counter")
    assert counted[0] == {"counter": 1.0, "task": tasks.short_lease.name, "database": "default"}
    # Before it, each re-queue was the WARNING of a lost connection.
    levels = [line["level"] for line in json_lines(worker) if "level" in line]
    assert levels.index("WARNING") < levels.index("ERROR")


def delivery(lease: int) -> Delivery:
    return Delivery(
        sender=tasks.short_lease,
        task_name=tasks.short_lease.name,
        key="k",
        scope=tasks.short_lease.name,
        fingerprint="f" * 64,
        task_id="t",
        lock_ttl=lease,
        record_ttl=3600,
        on_conflict="retry",
        atomic=False,
        max_attempts=0,
        max_result_bytes=0,
        no_broker=False,
    )


def refused() -> OperationalError:
    """The real error of a connection to a database that does not exist."""
    settings = {**connections["default"].settings_dict, "NAME": f"idem_gone_{uuid.uuid4().hex[:8]}"}
    gone = type(connections["default"])(settings, alias="gone")
    try:
        gone.ensure_connection()
    except OperationalError as exc:
        return exc
    finally:
        gone.close()
    raise AssertionError("connected to a database that does not exist")


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite creates a missing database file")
def test_the_error_comes_after_a_lease_of_failures_once_per_lease_and_ends_on_a_new_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exc, lease = refused(), 1
    caplog.set_level(logging.WARNING, "django_idempotent_tasks")

    def errors() -> list[logging.LogRecord]:
        return [record for record in caplog.records if record.levelno == logging.ERROR]

    outages.connection_failed(exc, lease_seconds=lease, send=delivery(lease).send)
    assert errors() == []  # a lost connection alone is an outage of a few seconds

    def fail_again() -> list[logging.LogRecord]:
        outages.connection_failed(exc, lease_seconds=lease, send=delivery(lease).send)
        return errors()

    wait_for(fail_again, what="the ERROR after a lease of failures")
    outages.connection_failed(exc, lease_seconds=lease, send=delivery(lease).send)
    assert len(errors()) == 1  # once per lease
    error = errors()[0]
    assert (error.database_alias, error.database_error) == ("default", " ".join(str(exc).split()))  # type: ignore[attr-defined]

    connections["default"].close()
    connections["default"].ensure_connection()  # the database answers again: the outage is over
    outages.connection_failed(exc, lease_seconds=lease, send=delivery(lease).send)
    assert len(errors()) == 1
