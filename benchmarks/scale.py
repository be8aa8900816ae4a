"""Section 3: latency as the table grows, purge rate, and worker memory over many tasks."""

from __future__ import annotations

import itertools
import time

from django.db import connection

from benchmarks import database, e2e, overhead, report, systems
from benchmarks.roundtrips import counting
from benchmarks.workers import Worker
from django_idempotent_tasks import purging, store

FILL_CHUNK = 100_000


def fill(existing: int, target: int) -> int:
    """Add finished records (in several scopes) until the table holds ``target`` filler rows."""
    with connection.cursor() as cursor:
        for start in range(existing, target, FILL_CHUNK):
            end = min(target, start + FILL_CHUNK)
            cursor.execute(
                f"INSERT INTO {overhead.RECORDS} (scope, key, task_name, status, fingerprint, result, steps,"
                " attempts, attempts_log, fence, claim_token, task_id, worker, created_at, started_at,"
                " completed_at, expires_at)"
                " SELECT 'bench.filler' || (g %% 10), 'key-' || g, 'bench.filler', 'SUCCEEDED',"
                " md5(g::text) || md5(g::text), '{\"ok\": true}', '{}', 1, '[]', 1, md5(g::text), '', '',"
                " now(), now(), now(),"
                " now() + interval '7 days' FROM generate_series(%s, %s - 1) AS g",
                [start, end],
            )
        cursor.execute(f"ANALYZE {overhead.RECORDS}")
    return target


def latency(levels: list[int], calls: int) -> str:
    overhead.prepare()
    ping, select, insert = overhead.floors()
    replay, first = overhead.paths()[:2]
    measured = [ping, select, insert, replay, first]
    with counting() as trips:
        first.call()
    rows, existing = [], 0
    for level in levels:
        started = time.monotonic()
        existing = fill(existing, level)
        filled = time.monotonic() - started
        samples: dict[str, list[float]] = {path.name: [] for path in measured}
        for path in measured:
            overhead.sample(path.call, max(10, calls // 20), [])
        for _ in range(10):
            for path in measured:
                overhead.sample(path.call, max(1, calls // 10), samples[path.name])
        p50 = {name: report.percentile(values, 0.5) for name, values in samples.items()}
        p95 = {name: report.percentile(values, 0.95) for name, values in samples.items()}
        floor = (
            trips.reads * p50[select.name]
            + trips.commits * p50[insert.name]
            + len(trips.redis) * p50[ping.name]
        )
        rows.append(
            (
                f"{level:,}",
                f"{filled:.0f} s",
                f"{report.us(p50[replay.name])} / {report.us(p95[replay.name])}",
                report.ratio(p50[replay.name] / p50[select.name]),
                f"{report.us(p50[first.name])} / {report.us(p95[first.name])}",
                report.ratio(p50[first.name] / floor),
                report.load(),
            )
        )
    return report.table(
        f"3a. Latency with existing records ({calls} calls each)",
        ["records", "fill time", "replay p50 / p95", "× SELECT", "first p50 / p95", "× its floor", "load"],
        rows,
        note="Ratios to the floors (as in 1b) measured at the same table size, interleaved with the paths.",
    )


def purge(rows: int) -> str:
    """Expire ``rows`` filler records and delete them the way the command and the task do."""
    database.ready()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {overhead.RECORDS} SET expires_at = now() - interval '1 day' WHERE id IN"
            f" (SELECT id FROM {overhead.RECORDS} WHERE scope LIKE 'bench.filler%%' ORDER BY id LIMIT %s)",
            [rows],
        )
        expired = cursor.rowcount
    before = report.load()
    started = time.perf_counter()
    deleted = purging.purge(store.records().expired(), batch_size=1000)
    seconds = time.perf_counter() - started
    return report.table(
        "3b. Purge of expired records (purging.purge, batch_size=1000, as the command and the task run it)",
        ["expired rows", "deleted", "seconds", "rows/s", "load"],
        [(f"{expired:,}", f"{deleted:,}", f"{seconds:.1f}", f"{deleted / seconds:,.0f}", before)],
    )


def memory(tasks: int, chunk: int = 1000) -> str:
    """Resident memory of a -P solo worker running IdempotentTask first executions, chunk by chunk."""
    database.ready()
    worker = Worker("solo", 1).start()
    counter = itertools.count()
    samples = []
    try:
        for done in range(0, tasks + chunk, chunk):
            messages = [(next(counter), False) for _ in range(chunk if done else 200)]
            e2e.measure(worker, systems.idempotent, "memory", messages, False)
            samples.append((done, worker.rss_kib()[0], report.load()))
    finally:
        worker.stop()
    first, last = samples[0][1], samples[-1][1]
    rows = [
        (f"{done:,}", f"{rss / 1024:.1f} MiB", load)
        for done, rss, load in samples[:: max(1, len(samples) // 8)]
    ]
    if rows[-1][0] != f"{samples[-1][0]:,}":
        rows.append((f"{samples[-1][0]:,}", f"{last / 1024:.1f} MiB", samples[-1][2]))
    return report.table(
        f"3c. Worker memory (-P solo, IdempotentTask first executions, {tasks:,} tasks after a 200-task warm-up)",
        ["tasks run", "RSS", "load"],
        rows,
        note=f"Growth over the run: {(last - first) / 1024:+.1f} MiB ({(last - first) / max(1, tasks) * 1024:+.1f} bytes per task).",
    )
