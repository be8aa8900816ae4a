"""The history of a record's attempts: events appended by the claim and end statements themselves, on
the database clock, and read back as one line per attempt."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models
from django.utils.dateparse import parse_datetime

#: Events kept on a record: a claim and its end each add one, so about the last 20 attempts.
MAX_EVENTS = 40
#: Event fields holding integers; every other one is text.
_INTEGERS = frozenset({"fence", "attempt"})

# The event's time, as ISO 8601 text in UTC, on the database server's clock.
_CLOCK_TEXT = {
    "postgresql": "to_char(CLOCK_TIMESTAMP() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
    "mysql": "DATE_FORMAT(UTC_TIMESTAMP(6), '%%Y-%%m-%%dT%%H:%%i:%%s.%%fZ')",
    "sqlite": "STRFTIME('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now')",
}


def _object_sql(vendor: str, names: tuple[str, ...]) -> str:
    at = "'at', " + _CLOCK_TEXT[vendor]
    if vendor == "postgresql":
        # Typed parameters: jsonb_build_object cannot guess a bare parameter's type.
        pairs = [f"'{name}', %s::{'integer' if name in _INTEGERS else 'text'}" for name in names]
        return f"jsonb_build_object({', '.join([*pairs, at])})"
    pairs = [f"'{name}', %s" for name in names]
    function = "JSON_OBJECT" if vendor == "mysql" else "json_object"
    return f"{function}({', '.join([*pairs, at])})"


@functools.cache
def first_sql(vendor: str, names: tuple[str, ...]) -> str:
    """SQL of a new history holding one event with the fields ``names`` (one parameter each)."""
    function = {"postgresql": "jsonb_build_array", "mysql": "JSON_ARRAY"}.get(vendor, "json_array")
    return f"{function}({_object_sql(vendor, names)})"


@functools.cache
def append_sql(vendor: str, column: str, names: tuple[str, ...]) -> str:
    """SQL of the history in ``column`` (quoted) with one event appended, the oldest dropped past
    ``MAX_EVENTS``: it refers to no other column, so MySQL's left-to-right SET order cannot matter."""
    event = _object_sql(vendor, names)
    if vendor == "postgresql":
        trimmed = (
            f"CASE WHEN jsonb_array_length({column}) >= {MAX_EVENTS} THEN {column} - 0 ELSE {column} END"
        )
        return f"({trimmed}) || jsonb_build_array({event})"
    if vendor == "mysql":
        trimmed = f"IF(JSON_LENGTH({column}) >= {MAX_EVENTS}, JSON_REMOVE({column}, '$[0]'), {column})"
        return f"JSON_ARRAY_APPEND({trimmed}, '$', {event})"
    trimmed = (
        f"CASE WHEN json_array_length({column}) >= {MAX_EVENTS} "
        f"THEN json_remove({column}, '$[0]') ELSE {column} END"
    )
    return f"json_insert({trimmed}, '$[#]', {event})"


class AppendEvent(models.Func):
    """An ORM update's value for ``attempts_log``: the history with ``event`` appended."""

    output_field = models.JSONField()

    def __init__(self, **event: str | int) -> None:
        super().__init__()
        self.event = event

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        column = connection.ops.quote_name("attempts_log")
        return append_sql(connection.vendor, column, tuple(self.event)), list(self.event.values())


#: How an attempt ended, in the words of the admin and ``idempotency_status``.
ENDINGS = {
    "completed": "completed",
    "failed": "failed",
    "died": "died mid-body",
    "taken_over": "died mid-body and was taken over",
    "lease_lost": "lost its lease",
    "released": "was released by an operator",
}


@dataclass
class Attempt:
    """One claim of a key: who held it, when, and how it ended (None while it runs)."""

    number: int
    fence: int
    worker: str
    task_id: str
    claimed_at: datetime | None
    ended_at: datetime | None = None
    ending: str | None = None
    detail: str = ""
    recovered: bool = False

    @property
    def seconds(self) -> float | None:
        """How long the attempt held the key, when both ends are known."""
        if self.claimed_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.claimed_at).total_seconds()

    def describe(self) -> str:
        """The attempt in one sentence, e.g. "attempt 1 on vm:15203 died mid-body after 2.1 s"."""
        text = f"attempt {self.number} on {self.worker or '?'}" + (" recovered and" if self.recovered else "")
        if self.ending is None:
            return f"{text} is running"
        text += f" {ENDINGS.get(self.ending, self.ending)}"
        if self.seconds is not None:
            text += (
                f" {self.seconds:.1f} s after it began"
                if self.ending == "taken_over"
                else f" after {self.seconds:.1f} s"
            )
        return f"{text} ({self.detail})" if self.detail else text

    def as_json(self) -> dict[str, Any]:
        return {
            "attempt": self.number,
            "fence": self.fence,
            "worker": self.worker,
            "task_id": self.task_id,
            "claimed_at": _iso(self.claimed_at),
            "ended_at": _iso(self.ended_at),
            "ending": self.ending,
            "seconds": self.seconds,
            "detail": self.detail,
            "recovered": self.recovered,
            "summary": self.describe(),
        }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _at(event: dict[str, Any]) -> datetime | None:
    text = event.get("at")
    return parse_datetime(text) if isinstance(text, str) else None


def attempts(log: Any) -> list[Attempt]:
    """The attempts a record's history tells of, oldest first."""
    found: list[Attempt] = []
    by_fence: dict[int, Attempt] = {}
    for event in log if isinstance(log, list) else []:
        if not isinstance(event, dict):
            continue
        kind, fence = event.get("event"), int(event.get("fence") or 0)
        if kind == "claimed":
            if found and found[-1].ending is None:
                # Claimed again while the last holder never ended: its lease expired and this
                # delivery took the key over.
                found[-1].ending, found[-1].ended_at = "taken_over", _at(event)
            attempt = Attempt(
                int(event.get("attempt") or len(found) + 1),
                fence,
                str(event.get("worker", "")),
                str(event.get("task_id", "")),
                _at(event),
            )
            found.append(attempt)
            by_fence[fence] = attempt
            continue
        ended = by_fence.get(fence)
        if ended is None or kind not in ENDINGS:
            continue
        # A holder that hears of its lost lease after a take-over ran on: lost, not dead.
        if ended.ending is None or kind == "lease_lost":
            ended.ending = str(kind)
            if ended.ended_at is None or kind != "lease_lost":
                ended.ended_at = _at(event)
            ended.detail = str(event.get("detail", ""))
    for previous, attempt in zip(found, found[1:], strict=False):
        # The previous holder stopped mid-body: this attempt may repeat what it had done.
        attempt.recovered = previous.ending in _INTERRUPTED
    return found


_INTERRUPTED = frozenset({"taken_over", "died", "lease_lost"})


def summary(log: Any) -> str:
    """Every attempt in one line, e.g. "attempt 1 on vm:15203 died mid-body …; attempt 2 recovered …"."""
    return "; ".join(attempt.describe() for attempt in attempts(log)) or "-"
