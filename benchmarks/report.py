"""Figures and tables: percentiles, ratios, the load average, and plain-text tables."""

from __future__ import annotations

import os
import platform
import statistics
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from django.db import connection


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``samples`` (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def load() -> str:
    """The 1, 5 and 15 minute load averages, to print next to the figures they may distort."""
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def ratio(value: float) -> str:
    return f"{value:.2f}×"


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]], note: str = "") -> str:
    """A Markdown table, printable as is and pasteable into BENCHMARKS.md."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    out = [f"### {title}", "", line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in cells[1:]]
    if note:
        out += ["", note]
    return "\n".join(out) + "\n"


def versions() -> str:
    """Python, Django, Celery, the peers, database-client and Redis-client versions of this run."""
    names = [
        "django",
        "celery",
        "kombu",
        "redis",
        "django-redis",
        "psycopg",
        "mysqlclient",
        "celery-once",
        "celery-singleton",
    ]
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} missing")
    return f"Python {sys.version.split()[0]}, " + ", ".join(found)


def database() -> str:
    """The vendor and server version of the database measured, e.g. ``PostgreSQL 15.20``."""
    connection.ensure_connection()
    wrapper: Any = connection  # the vendor's own wrapper: the version attributes are its own
    if connection.vendor == "postgresql":
        major, minor = divmod(wrapper.pg_version, 10_000)
        version = f"{major}.{minor}"
    elif connection.vendor == "mysql":
        version = wrapper.mysql_server_info.split("-")[0]
    else:
        version = wrapper.Database.sqlite_version
    return f"{connection.display_name} {version}"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs ({cpu})"
