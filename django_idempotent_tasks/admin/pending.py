"""How the admin tells a PENDING record's age and what the re-drive will do about it."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from django.utils.translation import gettext

from django_idempotent_tasks.conf import conf
from django_idempotent_tasks.models import IdempotencyRecord

Status = IdempotencyRecord.Status


def since(record: IdempotencyRecord) -> datetime:
    """When the record's current message was decided (the caller's INSERT, or the last Run again)."""
    return record.created_at


def age(moment: datetime) -> str:
    """The time since ``moment``, short: ``45 s``, ``12 min``, ``5 h``, ``3 d``."""
    seconds = max(0, int((timezone.now() - moment).total_seconds()))
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
    values = {"age": age(since(record)), "after": conf.REDRIVE_AFTER}
    overdue = (timezone.now() - since(record)).total_seconds() > conf.REDRIVE_AFTER
    if overdue:
        text = gettext(
            "Pending for %(age)s, past the re-drive age (%(after)s s): no worker has taken it. Check that "
            "redrive_idempotency_records runs (the beat entry django_idempotent_tasks.redrive_pending_records), "
            "or send it again."
        )
    else:
        text = gettext(
            "Pending for %(age)s: on its way to a worker. The re-drive sends it again once it is %(after)s s old."
        )
    return text % values
