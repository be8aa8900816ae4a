"""How the admin tells a PENDING record's age and what the re-drive will do about it."""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext

from django_idempotent_tasks.conf import conf
from django_idempotent_tasks.models import IdempotencyRecord

Status = IdempotencyRecord.Status


def _now() -> datetime:
    # Aware whatever USE_TZ says: the message's times are aware UTC (outbox.message).
    return datetime.now(dt_timezone.utc)


def _moment(record: IdempotencyRecord, name: str) -> datetime | None:
    value = record.message.get(name) if isinstance(record.message, dict) else None
    moment = parse_datetime(value) if isinstance(value, str) else None
    if moment is not None and timezone.is_naive(moment):
        return moment.replace(tzinfo=dt_timezone.utc)  # read as UTC, as the re-drive does
    return moment


def since(record: IdempotencyRecord) -> datetime:
    """When the record's message was last sent (by the caller, Run again or a re-send)."""
    created = record.created_at  # naive local time under USE_TZ=False
    return _moment(record, "sent_at") or (
        timezone.make_aware(created) if timezone.is_naive(created) else created
    )


def age(moment: datetime) -> str:
    """The time since ``moment``, short: ``45 s``, ``12 min``, ``5 h``, ``3 d``."""
    seconds = max(0, int((_now() - moment).total_seconds()))
    for unit, size, below in (("s", 1, 120), ("min", 60, 120), ("h", 3600, 48)):
        if seconds < size * below:
            return f"{seconds // size} {unit}"
    return f"{seconds // 86400} d"


def describe(record: IdempotencyRecord) -> str:
    """An outbox record's state for its page: how old a PENDING message is, what Run again does."""
    if record.status == Status.FAILED:
        return gettext("Failed: Run again puts it back to PENDING and publishes it under a new task id.")
    if record.status != Status.PENDING:
        return gettext("Taken by a worker: the stored message is kept until the key succeeds.")
    now = _now()
    values = {"age": age(since(record)), "after": conf.REDRIVE_AFTER}
    eta = _moment(record, "eta")
    # The re-drive's rule (outbox.due): REDRIVE_AFTER seconds past the last send and past the ETA.
    if max(since(record), eta or since(record)) + timedelta(seconds=conf.REDRIVE_AFTER) <= now:
        text = gettext(
            "Sent %(age)s ago, past the re-drive age (%(after)s s), and no worker has taken it: check that "
            "redrive_idempotency_records runs (the beat entry django_idempotent_tasks.redrive_pending_records), "
            "or send it again."
        )
    elif eta is not None and eta > now:
        values["eta"] = age(now - (eta - now))  # the time left until the ETA, in the same short form
        text = gettext(
            "Sent %(age)s ago for a run in %(eta)s (its ETA): the re-drive waits %(after)s s past the ETA."
        )
    else:
        text = gettext(
            "Sent %(age)s ago, on its way to a worker: the re-drive sends it again once it is %(after)s s old."
        )
    return text % values
