"""Section 1: the cost of each path in process, next to the round trips it cannot avoid."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection

from benchmarks import database, report
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
    database.ready()
    serial = "bigserial" if connection.vendor == "postgresql" else "bigint AUTO_INCREMENT"
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS bench_floor (id {serial} PRIMARY KEY, payload text NOT NULL)"
        )
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE bench_floor, {RECORDS}")
        else:  # MySQL truncates one table per statement
            cursor.execute("TRUNCATE bench_floor")
            cursor.execute(f"TRUNCATE {RECORDS}")
    lock_client().flushdb()


@dataclass
class Path:
    name: str
    call: Callable[[], object]
    target: float | None = None  # p50 at most this many times the floor
    cpu_budget: float | None = None  # CPU per call at most the floor's CPU plus this many seconds
    wal_syncs: int | None = None  # WAL flushes per call (see wal_counter), exactly
    # The round trips its target is measured against, when they are not the ones it sends now.
    floor_trips: RoundTrips | None = None


RECONNECT = "new connection (CELERY_DB_REUSE_MAX unset)"


def floors() -> list[Path]:
    """The physical floor: one Redis PING, one indexed SELECT, one INSERT + COMMIT (autocommit)."""
    client = lock_client()
    quote = connection.ops.quote_name  # KEY is a reserved word in MySQL
    sql = f"SELECT * FROM {RECORDS} WHERE {quote('scope')} = %s AND {quote('key')} = %s"

    def select() -> object:
        connection.ensure_connection()
        with connection.connection.cursor() as cursor:
            cursor.execute(sql, [SCOPE, "replay"])
            return cursor.fetchone()

    def insert() -> object:
        connection.ensure_connection()
        with connection.connection.cursor() as cursor:
            return cursor.execute("INSERT INTO bench_floor (payload) VALUES (%s)", ["floor"])

    return [Path("Redis PING", client.ping), Path("indexed SELECT", select), Path("INSERT + COMMIT", insert)]


def reconnect() -> object:
    """What Celery's Django fixup makes every task pay without CELERY_DB_REUSE_MAX (and with
    Django's default CONN_MAX_AGE=0): it closes the connection after the task, the next one opens it."""
    connection.close()
    connection.ensure_connection()
    return None


def wal_syncs(call: Callable[[], object], windows: int = 15) -> tuple[int, int]:
    """WAL flushes of one call (min and median over ``windows`` one-call windows), from
    ``wal_counter()``: a server-wide counter, so other sessions' flushes can only add."""
    deltas = []
    for _ in range(windows):
        before = _wal_sync()
        call()
        deltas.append(_wal_sync() - before)
    return min(deltas), round(report.median(deltas))


@functools.cache
def wal_counter() -> str:
    """The server's counter of log flushes: PostgreSQL's WAL syncs, or InnoDB's redo-log fsyncs."""
    if connection.vendor == "postgresql":
        return "pg_stat_wal.wal_sync"
    with connection.cursor() as cursor:
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_os_log_fsyncs'")
        # MariaDB 10.11 has none: its redo-log fsyncs count in Innodb_data_fsyncs, with the
        # data files' (background page flushes, which can only add, like other sessions).
        return "Innodb_os_log_fsyncs" if cursor.fetchone() else "Innodb_data_fsyncs"


def _wal_sync() -> int:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # A backend reports its WAL counters at most once a second unless told to flush them now.
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute("SELECT wal_sync FROM pg_stat_wal")
            return int(cursor.fetchone()[0])
        cursor.execute("SHOW GLOBAL STATUS LIKE %s", [wal_counter()])
        return int(cursor.fetchone()[1])


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
        Path("replay", lambda: idempotent("replay", False, idempotency_key="replay"), 1.5, wal_syncs=0),
        Path(
            "first execution",
            lambda: idempotent("u", False, idempotency_key=f"first-{next(counter)}"),
            1.4,
            cpu_budget=300e-6,
        ),
        Path(
            "first execution, atomic",
            lambda: idempotent_atomic("u", False, idempotency_key=f"atomic-{next(counter)}"),
            1.4,
            wal_syncs=1,
            # Issue #17: claim, body and completion in one commit; SELECT + 1 commit + SET + EVAL.
            floor_trips=RoundTrips(reads=1, commits=1, redis=["SET", "EVAL"]),
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


def interleaved(
    named: dict[str, Callable[[], object]], calls: int, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall times of each call and CPU per call of each block, the calls taking turns in ``rounds``
    blocks after a warm-up, so that load drifts hit them all alike."""
    wall: dict[str, list[float]] = {name: [] for name in named}
    cpu: dict[str, list[float]] = {name: [] for name in named}
    for call in named.values():
        sample(call, max(20, calls // 20), [])  # warm connections, caches and prepared plans
    for _ in range(rounds):
        for name, call in named.items():
            sample(call, max(1, calls // rounds), wall[name], cpu[name])
    return wall, cpu


@dataclass
class Measured:
    """Everything section 1 measured, by path name."""

    paths: list[Path]
    p50: dict[str, float]
    p95: dict[str, float]
    cpu: dict[str, float]
    trips: dict[str, RoundTrips]
    wal: dict[str, tuple[int, int]]

    def floor(self, name: str, quantile: dict[str, float]) -> float:
        """The sum of a path's own round trips (or its target's), each at ``quantile`` of the same
        round trip alone."""
        path = next(path for path in self.paths if path.name == name)
        counts = path.floor_trips or self.trips[name]
        return (
            counts.reads * quantile["indexed SELECT"]
            + counts.commits * quantile["INSERT + COMMIT"]
            + len(counts.redis) * quantile["Redis PING"]
        )


def run(calls: int, rounds: int = 10) -> str:
    """Measure floors and paths interleaved in ``rounds`` blocks, so load drifts hit both alike."""
    prepare()
    measured = [*floors(), Path(RECONNECT, reconnect), *paths()]
    before = report.load()
    samples, cpu = interleaved({path.name: path.call for path in measured}, calls, rounds)
    after = report.load()
    ours = measured[4:]
    trips: dict[str, RoundTrips] = {}
    for path in ours:
        with counting() as counts:
            path.call()
        trips[path.name] = counts
    wal = {path.name: wal_syncs(path.call) for path in ours if path.wal_syncs is not None}
    result = Measured(
        measured,
        {name: report.percentile(values, 0.5) for name, values in samples.items()},
        {name: report.percentile(values, 0.95) for name, values in samples.items()},
        {name: report.median(values) for name, values in cpu.items()},
        trips,
        wal,
    )
    load = f"{before} before, {after} after"
    return "\n".join([_floor_table(result, calls, load), _paths_table(result), targets(result)])


def _floor_table(m: Measured, calls: int, load: str) -> str:
    rows = [
        (p.name, report.us(m.p50[p.name]), report.us(m.p95[p.name]), report.us(m.cpu[p.name]))
        for p in m.paths[:4]
    ]
    first = m.p50["first execution"]
    return report.table(
        f"1a. Physical floor on {report.database()} ({calls} calls each, {load})",
        ["round trip", "p50", "p95", "CPU/call"],
        rows,
        note=f"The last row is what every task pays on top when Celery's Django fixup closes the "
        f"connection after each task (CELERY_DB_REUSE_MAX unset, CONN_MAX_AGE=0): "
        f"{m.p50[RECONNECT] / first:.1f}× a first execution's p50 (check {_W010}).",
    )


_W010 = "django_idempotent_tasks.W010"


def _paths_table(m: Measured) -> str:
    rows = []
    for path in m.paths[4:]:
        name = path.name
        wal = m.wal.get(name)
        rows.append(
            (
                name,
                report.us(m.p50[name]),
                report.us(m.p95[name]),
                m.trips[name].describe(),
                report.us(m.floor(name, m.p50)),
                report.us(m.cpu[name]),
                report.ratio(m.p50[name] / m.floor(name, m.p50)),
                report.ratio(m.p95[name] / m.floor(name, m.p95)),
                "" if wal is None else f"{wal[1]} (min {wal[0]})",
            )
        )
    header = ["path", "p50", "p95", "round trips", "floor p50", "CPU/call", "×floor p50", "×floor p95"]
    return report.table(
        f"1b. Our paths against the sum of their own round trips on {report.database()}",
        [*header, "WAL syncs/call"],
        rows,
        note="The floor of a path is the sum of its measured round trips (reads at the SELECT floor, "
        "commits at the INSERT + COMMIT floor, Redis commands at the PING floor). Direct calls "
        "(`task(...)`), which run IdempotentTask.__call__ exactly as a worker does. CPU/call is the "
        "process time of the calls (every thread), the part of the wall time spent in Python rather "
        "than waiting for a server. The atomic path's floor is its target's round trips (1 "
        "read + 1 commit + 2 Redis: claim, body and completion in one commit), not the ones it "
        f"sends today. WAL syncs/call: {wal_counter()} around one call, median "
        "(and minimum) of 15 calls; the counter is the whole server's, so other sessions only add."
        + _ROUND_TRIPS.get(connection.vendor, ""),
    )


_ROUND_TRIPS = {
    "mysql": " Round trips on MariaDB/MySQL are the client's calls (no protocol trace): every "
    "statement (Connection.query), commit, rollback, ping and change of autocommit mode (Django's "
    "transactions send SET autocommit=0 and =1 where PostgreSQL sends BEGIN); a write in "
    "autocommit mode counts as a commit.",
}


def _floor_cpu(m: Measured, name: str) -> float:
    return m.floor(name, m.cpu)


def targets(m: Measured) -> str:
    """Each target of issue #17 for section 1 beside its measured value: met or not met."""
    rows: list[tuple[str, str, str]] = []
    for path in m.paths[4:]:
        name = path.name
        if path.target is not None:
            ratio = m.p50[name] / m.floor(name, m.p50)
            rows.append(
                (f"{name}: p50 ≤ {path.target}× its floor", report.ratio(ratio), _met(ratio <= path.target))
            )
        if path.cpu_budget is not None:
            budget = _floor_cpu(m, name) + path.cpu_budget
            rows.append(
                (
                    f"{name}: CPU ≤ its floor's CPU + {path.cpu_budget * 1e6:.0f} µs",
                    f"{report.us(m.cpu[name])} vs {report.us(budget)}",
                    _met(m.cpu[name] <= budget),
                )
            )
        if path.wal_syncs is not None:
            syncs = m.wal[name][1]
            rows.append(
                (f"{name}: WAL syncs per call = {path.wal_syncs}", str(syncs), _met(syncs <= path.wal_syncs))
            )
    trips = m.trips["replay"]
    rows.append(
        (
            "replay: 1 SELECT, no Redis, no write",
            trips.describe(),
            _met(trips.database == 1 and trips.commits == 0 and not trips.redis),
        )
    )
    return report.table(
        f"1c. Targets (issue #17) on {report.database()}", ["target", "measured", "verdict"], rows
    )


def _met(ok: bool) -> str:
    return "met" if ok else "not met"
