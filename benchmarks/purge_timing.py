"""Time a purge of expired records on PostgreSQL while another process keeps claiming new keys.

Usage: DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python -m benchmarks.purge_timing
    [--rows 1000000] [--batch-size 1000] [--database idem_purge_timing]

It (re)creates its own database on the server of DATABASE_URL, fills it with ``--rows`` expired
SUCCEEDED records, measures insert latency alone for a few seconds (the baseline of this machine),
then purges with purging.purge while an inserter process calls store.insert in a loop, and prints the
purge's rows per second and the inserter's latencies (longest, 99th percentile, count over 100 ms).
Not part of ``make test``: it takes minutes and its figures depend on the machine.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
FILL = """
INSERT INTO django_idempotent_tasks_idempotencyrecord
    (scope, key, task_name, status, fingerprint, result, steps, attempts, attempts_log, fence,
     claim_token, task_id, worker, created_at, started_at, completed_at, expires_at)
SELECT 'timing', 'old-' || g, 'timing.task', 'SUCCEEDED', repeat('f', 64), '{"value": 1}'::jsonb,
       '{}'::jsonb, 1, '[]'::jsonb, 1, md5(g::text), 'task-' || g, 'host:1', now() - interval '30 days',
       now() - interval '30 days', now() - interval '30 days', now() - interval '1 day'
FROM generate_series(1, %s) AS g
"""


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def insert_loop(url: str, stop: Any, results: Any) -> None:
    """Claim new keys one after another until ``stop`` is set; send back each claim's duration."""
    setup_django(url)
    from django_idempotent_tasks import store

    durations: list[float] = []
    prefix = uuid.uuid4().hex[:8]
    while not stop.is_set():
        started = time.perf_counter()
        claim = store.insert(
            "timing-new",
            f"{prefix}-{len(durations)}",
            task_name="timing.task",
            fingerprint="f" * 64,
            task_id="t",
            worker="timing:1",
            lease_seconds=60,
            record_ttl=3600,
        )
        durations.append(time.perf_counter() - started)
        assert claim is not None
    results.put(durations[10:])  # the first claims open the connection


def measure_inserts(url: str, work: Any) -> tuple[list[float], Any]:
    """Run ``work()`` while an inserter process claims keys; return its durations and work's result."""
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    inserter = context.Process(target=insert_loop, args=(url, stop, results))
    inserter.start()
    time.sleep(3)  # let the inserter reach its loop
    outcome = work()
    stop.set()
    durations: list[float] = results.get(timeout=120)
    inserter.join(60)
    return durations, outcome


def describe(durations: list[float]) -> str:
    ms = sorted(d * 1000 for d in durations)
    p99 = ms[int(len(ms) * 0.99) - 1]
    over = sum(1 for d in ms if d > 100)
    return (
        f"{len(ms):,} inserts, median {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, "
        f"longest {ms[-1]:.1f} ms, {over} over 100 ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--database", default="idem_purge_timing")
    args = parser.parse_args()

    import psycopg

    server = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    with psycopg.connect(urlunsplit(server._replace(path="/postgres")), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.database}"')
        admin.execute(f'CREATE DATABASE "{args.database}"')
    url = urlunsplit(server._replace(path=f"/{args.database}"))
    setup_django(url)

    from django.core.management import call_command
    from django.db import connection

    from django_idempotent_tasks import purging, store

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(FILL, [args.rows])
        cursor.execute("VACUUM ANALYZE django_idempotent_tasks_idempotencyrecord")
    print(f"Filled {args.rows:,} expired records in {time.perf_counter() - started:.1f} s.")

    baseline, _ = measure_inserts(url, lambda: time.sleep(10))
    print(f"Baseline, no purge (10 s): {describe(baseline)}")

    batches: list[float] = []

    def purge() -> tuple[int, float]:
        begun = last = time.perf_counter()

        def progress(deleted: int) -> None:
            nonlocal last
            now = time.perf_counter()
            batches.append(now - last)
            last = now

        deleted = purging.purge(store.records().expired(), batch_size=args.batch_size, progress=progress)
        return deleted, time.perf_counter() - begun

    durations, (deleted, seconds) = measure_inserts(url, purge)
    print(
        f"Purge: {deleted:,} records in {seconds:.1f} s = {deleted / seconds:,.0f} rows/s "
        f"(batch size {args.batch_size})"
    )
    print(f"Inserts during the purge: {describe(durations)}")
    # A claim of a key in the batch being deleted waits for that batch's DELETE at most.
    print(
        f"Batches (SELECT + DELETE): {len(batches):,}, median {statistics.median(batches) * 1000:.1f} ms, "
        f"longest {max(batches) * 1000:.1f} ms"
    )
    connection.close()


if __name__ == "__main__":
    main()
