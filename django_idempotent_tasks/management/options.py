"""argparse ``type=`` validators shared by the management commands."""

from __future__ import annotations

import re
from argparse import ArgumentTypeError
from datetime import timedelta

from django_idempotent_tasks.models import IdempotencyRecord

_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def duration(value: str) -> timedelta:
    """A positive age such as ``7d``, ``12h`` or ``30m``."""
    match = re.fullmatch(r"([0-9]+)([dhm])", value)
    if match is None or int(match[1]) == 0:
        raise ArgumentTypeError(f"{value!r} is not a duration such as 7d, 12h or 30m.")
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


def age(value: str) -> timedelta:
    """A positive age such as ``1h``, ``10m`` or ``30s`` (``duration`` with seconds too)."""
    match = re.fullmatch(r"([0-9]+)s", value)
    if match is None:
        return duration(value)
    if int(match[1]) == 0:
        raise ArgumentTypeError(f"{value!r} is not a duration such as 1h, 10m or 30s.")
    return timedelta(seconds=int(match[1]))


def positive_int(value: str) -> int:
    """An integer of at least 1."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ArgumentTypeError(f"{value!r} is not a positive integer.")
    return number


def purgeable_status(value: str) -> str:
    """A status whose records a purge may delete, in any case (never PENDING: the re-drive owes
    those a send)."""
    purgeable = [status for status in IdempotencyRecord.Status.values if status != "PENDING"]
    if value.upper() == "PENDING":
        raise ArgumentTypeError(
            "PENDING records are never purged: the re-drive sends them "
            f"(redrive_idempotency_records); choose from {', '.join(purgeable)}."
        )
    if value.upper() not in purgeable:
        raise ArgumentTypeError(f"{value!r} is not a status; choose from {', '.join(purgeable)}.")
    return value.upper()


def non_empty(value: str) -> str:
    """A string that is not empty or only whitespace."""
    if not value.strip():
        raise ArgumentTypeError("must not be empty.")
    return value
