"""Idempotency records in the states operators meet, for the command, admin and browser tests.

One factory, ``make()``, and one word per state (``expired``, ``live``, ``stuck``, ``failed``).
Plain records (scope "s", task "tests.task", dates in 2020 and 2999) suit exact-output tests;
``shop=True`` gives the same states the fields of a real shop's deliveries, for the admin pages
and the README screenshots.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_idempotent_tasks.models import IdempotencyRecord

PAST = datetime(2020, 1, 1, tzinfo=dt_timezone.utc)
FUTURE = datetime(2999, 1, 1, tzinfo=dt_timezone.utc)
Status = IdempotencyRecord.Status
CHARGE = "shop.tasks.charge_customer"
EMAIL = "shop.tasks.send_receipt"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "shop/tasks.py", line 31, in send_receipt\n'
    "    mailer.send(order.email, receipt)\n"
    "smtplib.SMTPServerDisconnected: Connection unexpectedly closed\n"
)


def make(key: str, status: str = Status.SUCCEEDED, *, shop: bool = False, **fields: Any) -> IdempotencyRecord:
    """A record of ``key`` in ``status``, not expired unless told; ``fields`` override the defaults."""
    values = _shop(key, status) if shop else _plain()
    values.update(fields)
    return IdempotencyRecord.objects.create(key=key, status=status, **values)


def expired(
    key: str, status: str = Status.SUCCEEDED, *, shop: bool = False, **fields: Any
) -> IdempotencyRecord:
    """Past its retention (2020, or an hour ago): what a purge deletes."""
    at = timezone.now() - timedelta(hours=1) if shop else PAST
    return make(key, status, shop=shop, **{"expires_at": at, **fields})


def live(key: str, *, shop: bool = False, **fields: Any) -> IdempotencyRecord:
    """IN_PROGRESS with a running lease (until 2999, or for another minute): a body runs now."""
    until = timezone.now() + timedelta(minutes=1) if shop else FUTURE
    return _in_progress(key, until, shop, fields)


def stuck(key: str, *, shop: bool = False, **fields: Any) -> IdempotencyRecord:
    """IN_PROGRESS whose lease ran out (in 2020, or two minutes ago): its worker died mid-body."""
    until = timezone.now() - timedelta(minutes=2) if shop else PAST
    return _in_progress(key, until, shop, fields)


def failed(key: str, *, shop: bool = False, **fields: Any) -> IdempotencyRecord:
    """FAILED (with the shop's error and traceback when ``shop``): the next delivery runs it again."""
    return make(key, Status.FAILED, shop=shop, **fields)


def pending(key: str, *, age: float = 0, shop: bool = False, **fields: Any) -> IdempotencyRecord:
    """PENDING since ``age`` seconds, with the stored message of an outbox task: not delivered yet."""
    created = timezone.now() - timedelta(seconds=age)
    values: dict[str, Any] = {
        "created_at": created,
        "completed_at": None,
        "started_at": None,
        "result": None,
        "worker": "",
        "attempts": 0,
        "fence": 0,
        "task_id": str(uuid.uuid5(uuid.NAMESPACE_OID, key)),
        "message": message(CHARGE if shop else "tests.task", key, age=age),
    }
    return make(key, Status.PENDING, shop=shop, **{**values, **fields})


def message(task_name: str, key: str, *, age: float = 0, task_id: str = "") -> dict[str, Any]:
    """A stored outbox message (outbox.message()'s shape), sent ``age`` seconds ago."""
    sent_at = timezone.now() - timedelta(seconds=age)
    return {
        "task": task_name,
        "id": task_id or str(uuid.uuid5(uuid.NAMESPACE_OID, key)),
        "call": {"args": [42, 1000], "kwargs": {"idempotency_key": key}},
        "options": {},
        "eta": None,
        "expires": None,
        "sent_at": sent_at.isoformat(),
    }


def keys(among: list[str] | None = None) -> list[str]:
    """The keys of the table's records (of those ``among`` only, if given), sorted."""
    found = (
        IdempotencyRecord.objects.all() if among is None else IdempotencyRecord.objects.filter(key__in=among)
    )
    return sorted(found.values_list("key", flat=True))


def operator_scene() -> dict[str, IdempotencyRecord]:
    """The records of the README screenshots: results, a failure, a stuck and a live lease, expiries."""
    return {
        "expired": expired("order-charge-1001", shop=True),
        "failed": failed("receipt-order-1002", shop=True),
        "succeeded": make("order-charge-1003", shop=True, fence=2, attempts=2, attempts_log=recovered_log()),
        "long": make("customer-7781/invoice-2026-11/line-items/recompute-totals-after-refund", shop=True),
        "live": live("order-charge-1005", shop=True, scope="payments", task_name=CHARGE),
        "stuck": stuck("order-charge-1006", shop=True, attempts_log=recovered_log()[:2]),
        "result": make(
            "order-charge-1007",
            shop=True,
            result={"charge_id": "ch_3PqX9", "amount_cents": 12900, "currency": "eur"},
        ),
    }


def recovered_log(worker: str = "worker-1.example.internal:4242") -> list[dict[str, Any]]:
    """The attempts log of a key whose first holder died mid-body and whose lease a second one took over."""
    now = timezone.now()

    def at(seconds: float) -> str:
        return (
            (now - timedelta(seconds=seconds)).astimezone(dt_timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        )

    first, second = {"worker": worker, "task_id": "9b2e7c41"}, {"worker": "worker-2.example.internal:5151"}
    return [
        {"event": "claimed", "fence": 1, "attempt": 1, **first, "at": at(65.3)},
        {"event": "claimed", "fence": 2, "attempt": 2, **second, "task_id": "9b2e7c41", "at": at(1.3)},
        {"event": "completed", "fence": 2, "at": at(1.0)},
    ]


def _in_progress(key: str, until: datetime, shop: bool, fields: dict[str, Any]) -> IdempotencyRecord:
    defaults: dict[str, Any] = (
        {"lease_expires_at": until} if shop else {"lease_expires_at": until, "worker": "host:1"}
    )
    return make(key, Status.IN_PROGRESS, shop=shop, **{**defaults, **fields})


def _plain() -> dict[str, Any]:
    return {
        "scope": "s",
        "task_name": "tests.task",
        "fingerprint": "f" * 64,
        "expires_at": timezone.now() + timedelta(days=1),
    }


def _shop(key: str, status: str) -> dict[str, Any]:
    """A delivery of the shop's charge task that finished a second ago, then what ``status`` changes."""
    now = timezone.now()
    values: dict[str, Any] = {
        "scope": CHARGE,
        "task_name": CHARGE,
        "fingerprint": uuid.uuid5(uuid.NAMESPACE_URL, key).hex * 2,
        "result": {"charge_id": f"ch_{key[-6:]}", "amount_cents": 4200},
        "task_id": str(uuid.uuid5(uuid.NAMESPACE_DNS, key)),
        "worker": "worker-1.example.internal:4242",
        "started_at": now - timedelta(seconds=3),
        "completed_at": now - timedelta(seconds=1),
        "expires_at": now + timedelta(days=7),
    }
    if status == Status.IN_PROGRESS:
        values.update(
            result=None,
            completed_at=None,
            worker="worker-2.example.internal:5151",
            attempts=2,
            fence=2,
            steps={"reserve_stock": {"reservation": "rs_77"}},
        )
    elif status == Status.FAILED:
        error = {
            "type": "SMTPServerDisconnected",
            "message": "Connection unexpectedly closed",
            "traceback": TRACEBACK,
        }
        values.update(scope=EMAIL, task_name=EMAIL, result=None, error=error)
    return values


def age(key: str, seconds: int) -> None:
    """Make the record of ``key`` and its outbox message ``seconds`` older (for the re-drive)."""
    record = IdempotencyRecord.objects.get(key=key)
    message = dict(record.message or {})
    for name in ("sent_at", "eta"):
        at = parse_datetime(message.get(name) or "")
        if at is not None:
            message[name] = (at - timedelta(seconds=seconds)).isoformat()
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        created_at=record.created_at - timedelta(seconds=seconds), message=message
    )
