"""The records changelist's date hierarchy, drawn from the table's ends instead of a full scan."""

from __future__ import annotations

import calendar
from collections.abc import Callable
from datetime import date
from typing import Any

from django.utils import formats, timezone
from django.utils.text import capfirst
from django.utils.translation import gettext

from django_idempotent_tasks import compat, store


def created_range() -> tuple[date, date] | None:
    """Local dates of the oldest and newest record, read at both ends of the primary key index."""
    # Records are inserted as they are created, so created_at follows the primary key; Django's own
    # hierarchy runs MIN/MAX and SELECT DISTINCT date_trunc over every row, as created_at has no index.
    ends = store.records().order_by("pk").values_list("created_at", flat=True)
    oldest, newest = ends.first(), ends.last()
    if oldest is None or newest is None:
        return None
    first, last = sorted((timezone.localtime(oldest).date(), timezone.localtime(newest).date()))
    return first, last


def _months(first: date, last: date, year: int) -> list[date]:
    start = first.month if first.year == year else 1
    end = last.month if last.year == year else 12
    return [date(year, month, 1) for month in range(start, end + 1)]


def _days(first: date, last: date, year: int, month: int) -> list[date]:
    start = first.day if (first.year, first.month) == (year, month) else 1
    end = last.day if (last.year, last.month) == (year, month) else calendar.monthrange(year, month)[1]
    return [date(year, month, day) for day in range(start, end + 1)]


def hierarchy(cl: Any) -> dict[str, Any]:
    """Year, month and day links between the oldest and the newest record (empty days included)."""
    field = cl.date_hierarchy
    names = {part: f"{field}__{part}" for part in ("year", "month", "day")}
    span = created_range()
    if span is None:
        return {"show": False}
    first, last = span
    params = compat.changelist_params(cl)
    # The changelist has already answered invalid date parameters with its error redirect.
    year, month, day = (int(params[name]) if name in params else None for name in names.values())

    def link(**parts: int) -> str:
        return str(cl.get_query_string({names[k]: v for k, v in parts.items()}, [f"{field}__"]))

    if year is None and first.year == last.year:
        year, month = first.year, (first.month if first.month == last.month else None)
    return {"show": True, **_level(link, first, last, year, month, day)}


def _title(when: date, format_name: str) -> str:
    return capfirst(formats.date_format(when, format_name))


def _level(
    link: Callable[..., str], first: date, last: date, year: int | None, month: int | None, day: int | None
) -> dict[str, Any]:
    """The back link and the choices of the level the date parameters chose."""
    if year is not None and month is not None and day is not None:
        chosen = date(year, month, day)
        back = {"link": link(year=year, month=month), "title": _title(chosen, "YEAR_MONTH_FORMAT")}
        return {"back": back, "choices": [{"title": _title(chosen, "MONTH_DAY_FORMAT")}]}
    if year is not None and month is not None:
        choices = [
            {"link": link(year=year, month=month, day=d.day), "title": _title(d, "MONTH_DAY_FORMAT")}
            for d in _days(first, last, year, month)
        ]
        return {"back": {"link": link(year=year), "title": str(year)}, "choices": choices}
    if year is not None:
        choices = [
            {"link": link(year=year, month=m.month), "title": _title(m, "YEAR_MONTH_FORMAT")}
            for m in _months(first, last, year)
        ]
        return {"back": {"link": link(), "title": gettext("All dates")}, "choices": choices}
    return {"choices": [{"link": link(year=y), "title": str(y)} for y in range(first.year, last.year + 1)]}
