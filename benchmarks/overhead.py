"""Section 1: the cost of each path in process, next to the round trips it cannot avoid."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.core.management import call_command
from django.db import connection

from benchmarks import report
from benchmarks.roundtrips import RoundTrips, counting
from benchmarks.systems import idempotent, idempotent_atomic, idempotent_raise
from django_idempotent_tasks import keys, store
from django_idempotent_tasks.exceptions import TaskInProgress
from django_idempotent_tasks.locks import lock_client
from django_idempotent_tasks.models import IdempotencyRecord

RECORDS = IdempotencyRecord._meta.db_table
SCOPE = idempotent.name


def prepare() -> None:
    """Migrate, create the floor's table and start from no records and no locks."""
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, payload text NOT NULL)"
        )
        cursor.execute(f"TRUNCATE bench_floor, {RECORDS}")
    lock_client().flushdb()


@dataclass
class Path:
    name: str
    call: Callable[[], object]
    target: float | None = None


def floors() -> list[Path]:
    """The physical floor: one Redis PING, one indexed SELECT, one INSERT + COMMIT (autocommit)."""
    connection.ensure_connection()
    raw = connection.connection
    client = lock_client()
    sql = f"SELECT * FROM {RECORDS} WHERE scope = %s AND key = %s"

    def select() -> object:
        with raw.cursor() as cursor:
            cursor.execute(sql, [SCOPE, "replay"])
            return cursor.fetchone()

    def insert() -> object:
        with raw.cursor() as cursor:
            return cursor.execute("INSERT INTO bench_floor (payload) VALUES (%s)", ["floor"])

    return [Path("Redis PING", client.ping), Path("indexed SELECT", select), Path("INSERT + COMMIT", insert)]


def paths() -> list[Path]:
    """Our paths; their records and locks are set up here, as a real delivery would find them."""
    idempotent("replay", False, idempotency_key="replay")
    counter = itertools.count()
    held = keys.lock_name(idempotent_raise.name, "conflict-lock")
    lock_client().set(held, "another-worker", px=3_600_000)
    store.insert(
        idempotent_raise.name,
        "conflict-lease",
        task_name=idempotent_raise.name,
        fingerprint=keys.fingerprint([], {"unit": "c", "work": False}),
        task_id="another",
        worker="another-worker",
        lease_seconds=3600,
        record_ttl=3600,
    )

    def conflict(key: str) -> Callable[[], object]:
        def call() -> object:
            try:
                idempotent_raise("c", False, idempotency_key=key)
            except TaskInProgress:
                return None
            raise AssertionError("the conflict path ran the body")

        return call

    return [
        Path("replay", lambda: idempotent("replay", False, idempotency_key="replay"), 1.2),
        Path(
            "first execution", lambda: idempotent("u", False, idempotency_key=f"first-{next(counter)}"), 1.2
        ),
        Path(
            "first execution, atomic",
            lambda: idempotent_atomic("u", False, idempotency_key=f"atomic-{next(counter)}"),
            1.2,
        ),
        Path("lock conflict (Redis lock held)", conflict("conflict-lock")),
        Path("lock conflict (live lease)", conflict("conflict-lease")),
    ]


def sample(call: Callable[[], object], count: int, into: list[float], cpu: list[float] | None = None) -> None:
    """Append the wall time of ``count`` calls to ``into``, and their CPU time (all threads) to ``cpu``."""
    started = time.process_time()
    for _ in range(count):
        start = time.perf_counter()
        call()
        into.append(time.perf_counter() - start)
    if cpu is not None:
        cpu.append((time.process_time() - started) / count)


def run(calls: int, rounds: int = 10) -> str:
    """Measure floors and paths interleaved in ``rounds`` blocks, so load drifts hit both alike."""
    prepare()
    measured = [*floors(), *paths()]
    samples: dict[str, list[float]] = {path.name: [] for path in measured}
    cpu: dict[str, list[float]] = {path.name: [] for path in measured}
    before = report.load()
    for path in measured:
        sample(path.call, max(20, calls // 20), [])  # warm connections, caches and prepared plans
    for _ in range(rounds):
        for path in measured:
            sample(path.call, max(1, calls // rounds), samples[path.name], cpu[path.name])
    after = report.load()
    trips: dict[str, RoundTrips] = {}
    for path in measured[3:]:
        with counting() as counts:
            path.call()
        trips[path.name] = counts
    cpu_per_call = {name: report.median(values) for name, values in cpu.items()}
    return _tables(measured, samples, cpu_per_call, trips, calls, f"{before} before, {after} after")


def _tables(
    measured: list[Path],
    samples: dict[str, list[float]],
    cpu: dict[str, float],
    trips: dict[str, RoundTrips],
    calls: int,
    load: str,
) -> str:
    p50 = {name: report.percentile(values, 0.5) for name, values in samples.items()}
    p95 = {name: report.percentile(values, 0.95) for name, values in samples.items()}
    floor_rows = [
        (p.name, report.us(p50[p.name]), report.us(p95[p.name]), report.us(cpu[p.name])) for p in measured[:3]
    ]
    rows = []
    for path in measured[3:]:
        counts = trips[path.name]

        def floor(quantile: dict[str, float], counts: RoundTrips = counts) -> float:
            return (
                counts.reads * quantile["indexed SELECT"]
                + counts.commits * quantile["INSERT + COMMIT"]
                + len(counts.redis) * quantile["Redis PING"]
            )

        ratio50, ratio95 = p50[path.name] / floor(p50), p95[path.name] / floor(p95)
        verdict = "" if path.target is None else ("met" if ratio50 <= path.target else "missed")
        rows.append(
            (
                path.name,
                report.us(p50[path.name]),
                report.us(p95[path.name]),
                counts.describe(),
                report.us(floor(p50)),
                report.us(cpu[path.name]),
                report.ratio(ratio50),
                report.ratio(ratio95),
                f"≤ {path.target}× {verdict}" if path.target else "",
            )
        )
    return (
        report.table(
            f"1a. Physical floor ({calls} calls each, {load})",
            ["round trip", "p50", "p95", "CPU/call"],
            floor_rows,
        )
        + "\n"
        + report.table(
            "1b. Our paths against the sum of their own round trips",
            [
                "path",
                "p50",
                "p95",
                "round trips",
                "floor p50",
                "CPU/call",
                "×floor p50",
                "×floor p95",
                "target",
            ],
            rows,
            note="The floor of a path is the sum of its measured round trips (reads at the SELECT floor, "
            "commits at the INSERT + COMMIT floor, Redis commands at the PING floor). Direct calls "
            "(`task(...)`), which run IdempotentTask.__call__ exactly as a worker does. CPU/call is the "
            "process time of the calls (every thread), the part of the wall time spent in Python rather "
            "than waiting for a server.",
        )
    )
