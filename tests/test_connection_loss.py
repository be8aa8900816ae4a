"""A body that outlives its own database connection completes once (P7), with real prefork workers.

PostgreSQL (``idle_session_timeout``) and MariaDB (``wait_timeout``) cut an idle connection; SQLite
has no server connection to cut.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import SETTLE_TIMEOUT, Worker, calls, settled
from tests.testapp import tasks

pytestmark = [
    pytest.mark.workers,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no server connection to cut"),
]
PAST_THE_CUT = 3  # seconds the body sleeps: the server drops its connection after 1 s idle


def error_of(record: IdempotencyRecord) -> dict[str, str]:
    assert record.error is not None
    return dict(record.error)


def test_a_body_that_outlives_its_connection_completes_once(running_workers: list[Worker]) -> None:
    tasks.outlives_its_connection.delay(PAST_THE_CUT, idempotency_key="p7")
    record = settled("p7")
    assert (record.status, record.fence, record.attempts, record.result) == ("SUCCEEDED", 1, 1, {"fence": 1})
    assert calls("p7") == 1


@pytest.mark.parametrize(
    "task",
    [
        tasks.deadlocks,
        # The body closed its connection and opened another (close_old_connections in a long task):
        # the server's refusal on the new one is still its own error.
        tasks.times_out_after_reconnecting,
    ],
    ids=["deadlock", "timeout after reconnecting"],
)
def test_the_bodys_own_operational_error_follows_its_retry_policy(
    running_workers: list[Worker], task: Any
) -> None:
    key = f"own-{task.__name__}"
    result = task.delay(idempotency_key=key)
    result.get(timeout=SETTLE_TIMEOUT, propagate=False)
    # One run and the one autoretry of max_retries=1, then the task fails with the body's error:
    # never re-queued as if its connection had died (which ran the body again after each lease).
    assert (result.state, type(result.result).__name__) == ("FAILURE", "OperationalError")
    record = settled(key)
    assert (record.status, record.attempts, error_of(record)["type"]) == ("FAILED", 2, "OperationalError")
    assert calls(key) == 2
