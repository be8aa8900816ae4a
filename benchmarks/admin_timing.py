#!/usr/bin/env python
"""Time the records admin, the commands and the purge at a million records (a throwaway database).

    make bench-admin DATABASE_URL=postgres://postgres@127.0.0.1:5432/idem_admin_timing
    make bench-admin DATABASE_URL=mysql://root@localhost/idem_admin_timing
    make bench-admin DATABASE_URL=sqlite:////tmp/idem_admin_timing.sqlite3

It creates the database if needed, fills it (once) with ``--rows`` records: 12 task scopes, 2 %
FAILED, 0.1 % IN_PROGRESS (half of them stuck), one in 3,000 PENDING (an outbox message never sent),
created over 30 days and kept 27, so the oldest tenth is expired. Then it prints the median of ``--runs`` timings of each page and command, and the
purge's rate over the expired tenth (restored after each run), then over the same tenth expiring at
one instant. Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TABLE = "django_idempotent_tasks_idempotencyrecord"
COLUMNS = (
    "scope",
    "key",
    "task_name",
    "status",
    "fingerprint",
    "result",
    "error",
    "steps",
    "attempts",
    "attempts_log",
    "fence",
    "claim_token",
    "task_id",
    "message",
    "worker",
    "lease_expires_at",
    "created_at",
    "started_at",
    "completed_at",
    "expires_at",
)
SCOPES = 12
HISTORY = timedelta(days=30)
RETENTION = timedelta(days=27)
ERROR = '{"type": "Timeout", "message": "gateway timed out", "traceback": ""}'
MESSAGE = '{"task": "shop.tasks.charge", "args": [], "kwargs": {"order": %d}, "options": {}}'


def create_database(url: str) -> None:
    """Create the database of ``url`` if it does not exist (SQLite creates its file itself)."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if parts.scheme.startswith("postgres"):
        import psycopg

        with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
    elif parts.scheme.startswith("mysql"):
        import MySQLdb

        conn = MySQLdb.connect(user=parts.username or "root", host=parts.hostname or "localhost")
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
        conn.close()


def setup(url: str) -> None:
    create_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def rows(first: int, last: int, total: int, now: datetime) -> Iterator[tuple[Any, ...]]:
    """Records ``first`` to ``last`` (1-based) of ``total``, as tuples in COLUMNS order."""
    start = now - HISTORY
    for n in range(first, last + 1):
        scope = f"shop.tasks.task_{n % SCOPES}"
        if n % 1000 == 0:
            status = "IN_PROGRESS"
        elif n % 3000 == 1500:  # outbox records whose message was never sent: the re-drive's
            status = "PENDING"
        elif n % 50 == 7:
            status = "FAILED"
        else:
            status = "SUCCEEDED"
        created = start + HISTORY * n / total
        lease = None
        if status == "IN_PROGRESS":  # half stuck (lease gone an hour ago), half live
            lease = now - timedelta(hours=1) if n % 2000 == 0 else now + timedelta(hours=1)
        result = f'{{"charge_id": "ch_{n}", "amount_cents": {n}}}' if status == "SUCCEEDED" else None
        yield (
            scope,
            f"order-charge-{n}",
            scope,
            status,
            f"{n:064x}",
            result,
            ERROR if status == "FAILED" else None,
            "{}",
            1,
            "[]",
            1,
            f"{n:032x}",
            f"{n:032x}",
            MESSAGE % n if status == "PENDING" else None,
            "" if status == "PENDING" else f"worker-{n % 4}:{1000 + n % 7}",
            lease,
            created,
            None if status == "PENDING" else created,
            None if status in ("IN_PROGRESS", "PENDING") else created,
            created + RETENTION,
        )


def insert(first: int, last: int, total: int, now: datetime) -> None:
    """Insert records ``first`` to ``last``: COPY on PostgreSQL, multi-row INSERTs elsewhere."""
    from django.db import connection, transaction

    names = ", ".join(connection.ops.quote_name(c) for c in COLUMNS)
    chunk = 20_000
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {TABLE} ({names}) FROM STDIN") as copy:
                for row in rows(first, last, total, now):
                    copy.write_row(row)
            return
        marks = ", ".join(["%s"] * len(COLUMNS))
        sql = f"INSERT INTO {TABLE} ({names}) VALUES ({marks})"
        naive = [COLUMNS.index(c) for c in COLUMNS if c.endswith("_at")]
        for low in range(first, last + 1, chunk):
            batch = []
            for row in rows(low, min(low + chunk - 1, last), total, now):
                values = list(row)
                for i in naive:  # both store UTC without a zone under USE_TZ
                    if values[i] is not None:
                        values[i] = values[i].replace(tzinfo=None).isoformat(" ")
                batch.append(values)
            # mysqlclient sends an executemany INSERT as multi-row statements.
            cursor.executemany(sql, batch)


def analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"VACUUM ANALYZE {TABLE}")
        elif connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {TABLE}")
            cursor.fetchall()
        else:
            cursor.execute(f"ANALYZE {TABLE}")


def seed(total: int) -> datetime:
    """Fill the table once with ``total`` records; returns the "now" they were generated around."""
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*), MAX(expires_at) FROM {TABLE}")
        count, newest = cursor.fetchone()
    if count == total and newest is not None:
        if isinstance(newest, str):
            newest = datetime.fromisoformat(newest)
        if newest.tzinfo is None:
            newest = newest.replace(tzinfo=timezone.utc)
        seeded: datetime = newest - RETENTION
        return seeded  # the run that seeded it
    print(f"Seeding {total:,} records…", flush=True)
    now = datetime.now(timezone.utc)
    started = time.perf_counter()
    with connection.cursor() as cursor:  # SQLite's unqualified DELETE is its TRUNCATE
        cursor.execute(f"{'DELETE FROM' if connection.vendor == 'sqlite' else 'TRUNCATE'} {TABLE}")
    insert(1, total, total, now)
    analyze()
    print(f"Seeded in {time.perf_counter() - started:.0f} s.", flush=True)
    return now


def median_ms(runs: int, work: Callable[[], Any]) -> tuple[float, int, float]:
    """Median milliseconds of ``runs`` calls after one warm-up; queries and slowest query of the last."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    work()
    times = []
    for _ in range(runs):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            work()
            times.append((time.perf_counter() - started) * 1000)
    slowest = max((float(q["time"]) for q in queries.captured_queries), default=0.0) * 1000
    return statistics.median(times), len(queries.captured_queries), slowest


def purge_rates(total: int, now: datetime, runs: int, *, one_expiry: bool = False) -> list[float]:
    """Rows per second of ``runs`` purges of the expired tenth, restored after each; with
    ``one_expiry``, its records all expire at the same instant (as after a bulk UPDATE)."""
    from django_idempotent_tasks import compat, purging, store

    rates = []
    for _ in range(runs):
        if one_expiry:
            store.records().expired().update(expires_at=now - timedelta(days=1))
        started = time.perf_counter()
        deleted = purging.purge(store.records().expired(), batch_size=1000)
        rates.append(deleted / (time.perf_counter() - started))
        # Put the expired range back as it was: every record expired by now, the live leftovers too.
        last = int((datetime.now(timezone.utc) - now + HISTORY - RETENTION) / HISTORY * total)
        cutoff = now - HISTORY + HISTORY * last / total + RETENTION
        compat.raw_delete(store.records().filter(expires_at__lte=cutoff))
        insert(1, last, total, now)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idem_admin_timing"),
        help="the throwaway database (default: DATABASE_URL)",
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="records to create (default: 1000000)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each (default: 5)")
    options = parser.parse_args()
    setup(options.database_url)
    now = seed(options.rows)

    from django.contrib import admin
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client, override_settings
    from django.urls import path
    from django.utils import timezone

    from benchmarks import report
    from django_idempotent_tasks import store
    from django_idempotent_tasks.models import IdempotencyRecord

    urls = types.ModuleType("admin_timing_urls")
    urls.urlpatterns = [path("admin/", admin.site.urls)]  # type: ignore[attr-defined]
    sys.modules[urls.__name__] = urls
    user = User.objects.filter(username="timing").first() or User.objects.create_superuser("timing", "", "x")
    client = Client()
    client.force_login(user)
    key = f"order-charge-{options.rows * 7 // 9}"
    pk = IdempotencyRecord.objects.get(key=key).pk

    def day(ago: int) -> str:
        when = now - timedelta(days=ago)
        return f"created_at__year={when.year}&created_at__month={when.month}&created_at__day={when.day}"

    base = "/admin/django_idempotent_tasks/idempotencyrecord/"
    pages = [
        ("changelist, no filter", base),
        ("status = FAILED", f"{base}?status__exact=FAILED"),
        ("status = PENDING", f"{base}?status__exact=PENDING"),
        ("stuck = yes", f"{base}?stuck=yes"),
        ("exact-key search", f"{base}?q={key}"),
        ("prefix search `key*`", f"{base}?q={key[:-2]}*"),
        ("contains search `*key*`", f"{base}?q=*{key[-7:]}*"),
        ("date drill-down, today", f"{base}?{day(0)}"),
        ("date drill-down, 14 days back", f"{base}?{day(14)}"),
        ("detail page", f"{base}{pk}/change/"),
    ]

    def get(url: str) -> Callable[[], None]:
        def work() -> None:
            assert client.get(url).status_code == 200, url

        return work

    def command(*args: str) -> Callable[[], None]:
        def work() -> None:
            call_command(*args, stdout=io.StringIO())

        return work

    def redrive() -> None:
        """The re-drive's query: PENDING records at least ten minutes old, oldest first."""
        due = store.records().filter(
            status="PENDING", created_at__lte=timezone.now() - timedelta(seconds=600)
        )
        assert list(due.order_by("created_at", "pk")[:100])

    timings = [(label, get(url)) for label, url in pages] + [
        ("`idempotency_status`", command("idempotency_status")),
        ("`idempotency_status KEY --json`", command("idempotency_status", key, "--json")),
        ("`release_idempotency_lock KEY`", command("release_idempotency_lock", key)),
        ("re-drive query (PENDING, 600 s)", redrive),
    ]
    print(f"{options.rows:,} records on {report.database()}, median of {options.runs} runs")
    print(f"| {'operation':<32} | {'median':>10} | {'queries':>7} | {'slowest':>9} |")
    print(f"|{'-' * 34}|{'-' * 12}|{'-' * 9}|{'-' * 11}|")
    with override_settings(ROOT_URLCONF=urls.__name__):
        for label, work in timings:
            ms, queries, slowest = median_ms(options.runs, work)
            print(f"| {label:<32} | {ms:7,.0f} ms | {queries:>7} | {slowest:6,.0f} ms |", flush=True)
    for one_expiry, label in ((False, "expired rows"), (True, "rows, one expiry")):
        rates = purge_rates(options.rows, now, options.runs, one_expiry=one_expiry)
        rate = f"{statistics.median(rates):,.0f} rows/s"
        print(f"| {'purge of ' + format(options.rows // 10, ',') + ' ' + label:<32} | {rate:>10} | | |")
    print(f"(load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    main()
