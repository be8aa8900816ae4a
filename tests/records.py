"""Idempotency records in the states operators meet, for the command, admin and browser tests."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.utils import timezone

from django_idempotent_tasks.models import IdempotencyRecord

PAST = datetime(2020, 1, 1, tzinfo=dt_timezone.utc)
FUTURE = datetime(2999, 1, 1, tzinfo=dt_timezone.utc)


def make(key: str, status: str = "SUCCEEDED", **fields: Any) -> IdempotencyRecord:
    """A record of ``key`` (scope "s", task "tests.task" unless given), not expired by default."""
    values: dict[str, Any] = {
        "scope": "s",
        "task_name": "tests.task",
        "fingerprint": "f" * 64,
        "expires_at": timezone.now() + timedelta(days=1),
    }
    values.update(fields)
    return IdempotencyRecord.objects.create(key=key, status=status, **values)


def expired(key: str, status: str = "SUCCEEDED", **fields: Any) -> IdempotencyRecord:
    return make(key, status, expires_at=PAST, **fields)


def live(key: str, **fields: Any) -> IdempotencyRecord:
    """IN_PROGRESS with a lease that runs until 2999."""
    return make(key, "IN_PROGRESS", lease_expires_at=FUTURE, worker="host:1", **fields)


def stuck(key: str, **fields: Any) -> IdempotencyRecord:
    """IN_PROGRESS with a lease that ran out in 2020."""
    return make(key, "IN_PROGRESS", lease_expires_at=PAST, worker="host:1", **fields)


def keys() -> list[str]:
    return sorted(IdempotencyRecord.objects.values_list("key", flat=True))


Status = IdempotencyRecord.Status
CHARGE = "shop.tasks.charge_customer"
EMAIL = "shop.tasks.send_receipt"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "shop/tasks.py", line 31, in send_receipt\n'
    "    mailer.send(order.email, receipt)\n"
    "smtplib.SMTPServerDisconnected: Connection unexpectedly closed\n"
)


def make_record(key: str, **fields: Any) -> IdempotencyRecord:
    """A record created directly, with the fields of a finished delivery unless told otherwise."""
    now = timezone.now()
    values: dict[str, Any] = {
        "scope": CHARGE,
        "task_name": CHARGE,
        "status": Status.SUCCEEDED,
        "fingerprint": uuid.uuid5(uuid.NAMESPACE_URL, key).hex * 2,
        "result": {"charge_id": f"ch_{key[-6:]}", "amount_cents": 4200},
        "task_id": str(uuid.uuid5(uuid.NAMESPACE_DNS, key)),
        "worker": "worker-1.example.internal:4242",
        "started_at": now - timedelta(seconds=3),
        "completed_at": now - timedelta(seconds=1),
        "expires_at": now + timedelta(days=7),
    }
    values.update(fields)
    return IdempotencyRecord.objects.create(key=key, **values)


def make_stuck(key: str, **fields: Any) -> IdempotencyRecord:
    """IN_PROGRESS whose lease ran out two minutes ago: its worker died mid-body."""
    now = timezone.now()
    values: dict[str, Any] = {
        "status": Status.IN_PROGRESS,
        "result": None,
        "completed_at": None,
        "worker": "worker-2.example.internal:5151",
        "attempts": 2,
        "fence": 2,
        "lease_expires_at": now - timedelta(minutes=2),
        "steps": {"reserve_stock": {"reservation": "rs_77"}},
    }
    values.update(fields)
    return make_record(key, **values)


def make_live(key: str, **fields: Any) -> IdempotencyRecord:
    """IN_PROGRESS with a running lease: a delivery is executing the body now."""
    values: dict[str, Any] = {"lease_expires_at": timezone.now() + timedelta(minutes=1)}
    values.update(fields)
    return make_stuck(key, **values)


def make_failed(key: str, **fields: Any) -> IdempotencyRecord:
    """FAILED with an error and its traceback: the next delivery runs it again."""
    values: dict[str, Any] = {
        "scope": EMAIL,
        "task_name": EMAIL,
        "status": Status.FAILED,
        "result": None,
        "error": {
            "type": "SMTPServerDisconnected",
            "message": "Connection unexpectedly closed",
            "traceback": TRACEBACK,
        },
    }
    values.update(fields)
    return make_record(key, **values)


def make_expired(key: str, **fields: Any) -> IdempotencyRecord:
    """SUCCEEDED and past its retention: what a purge deletes."""
    values: dict[str, Any] = {"expires_at": timezone.now() - timedelta(hours=1)}
    values.update(fields)
    return make_record(key, **values)


def operator_scene() -> dict[str, IdempotencyRecord]:
    """The records of the README screenshots: results, a failure, a stuck and a live lease, expiries."""
    return {
        "expired": make_expired("order-charge-1001"),
        "failed": make_failed("receipt-order-1002"),
        "succeeded": make_record("order-charge-1003", fence=2, attempts=2),
        "long": make_record("customer-7781/invoice-2026-11/line-items/recompute-totals-after-refund"),
        "live": make_live("order-charge-1005", scope="payments", task_name=CHARGE),
        "stuck": make_stuck("order-charge-1006"),
        "result": make_record(
            "order-charge-1007", result={"charge_id": "ch_3PqX9", "amount_cents": 12900, "currency": "eur"}
        ),
    }
