"""Section 1d: where a first execution's CPU goes, layer by layer.

The same five round trips (lookup SELECT, lock SET, claim INSERT, completion UPDATE, release EVAL)
are sent three ways, interleaved: on the bare driver connections, through the package's own I/O
functions (``store`` and ``RedisLock``, i.e. Django's cursor and redis-py's command layer), and as
a whole delivery. The differences are what each layer costs, measured rather than guessed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from django.db import connection

from benchmarks import database, report
from benchmarks.overhead import interleaved
from benchmarks.systems import idempotent
from django_idempotent_tasks import keys, store
from django_idempotent_tasks.locks import RedisLock, lock_client
from django_idempotent_tasks.models import IdempotencyRecord

SCOPE = idempotent.name
LEASE, RETENTION = 60, 3600


def _bare_calls() -> Callable[[], object]:
    """The five round trips on the driver connections: no Django cursor, no store, no RedisLock."""
    client, counter = lock_client(), itertools.count()
    quote = connection.ops.quote_name
    table = quote(IdempotencyRecord._meta.db_table)
    select = f"SELECT * FROM {table} WHERE {quote('scope')} = %s AND {quote('key')} = %s"
    release = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"

    def call() -> object:
        name = f"bare-{next(counter)}"
        connection.ensure_connection()
        with connection.connection.cursor() as cursor:
            cursor.execute(select, [SCOPE, name])
            cursor.fetchall()
            client.set(name, "token", nx=True, px=LEASE * 1000)
            cursor.execute("INSERT INTO bench_floor (payload) VALUES (%s) RETURNING id", [name])
            (pk,) = cursor.fetchone()
            cursor.execute("UPDATE bench_floor SET payload = %s WHERE id = %s", ["done", pk])
            return client.eval(release, 1, name, "token")

    return call


def _package_calls() -> Callable[[], object]:
    """The same round trips through the package's I/O functions, without the delivery around them."""
    client, counter = lock_client(), itertools.count()
    fingerprint = keys.fingerprint(["u", False], {})

    def call() -> object:
        key = f"layers-{next(counter)}"
        store.lookup(SCOPE, key)
        lock = RedisLock(client, keys.lock_name(SCOPE, key), LEASE)
        lock.acquire()
        claim = store.insert(
            SCOPE,
            key,
            task_name=SCOPE,
            fingerprint=fingerprint,
            task_id="layers",
            worker="layers",
            lease_seconds=LEASE,
            record_ttl=RETENTION,
        )
        assert claim is not None
        store.complete(claim, None, None, RETENTION)
        return lock.release()

    return call


def _delivery_calls() -> Callable[[], object]:
    counter = itertools.count()
    return lambda: idempotent("u", False, idempotency_key=f"layers-delivery-{next(counter)}")


def run(calls: int, rounds: int = 10) -> str:
    """Measure the three layers interleaved in ``rounds`` blocks; expects overhead.prepare() done."""
    database.ready()
    layers = {
        "bare driver calls": _bare_calls(),
        "the package's I/O functions": _package_calls(),
        "the whole delivery": _delivery_calls(),
    }
    wall, cpu = interleaved(layers, calls, rounds)
    medians = {name: report.median(values) for name, values in cpu.items()}
    rows: list[tuple[Any, ...]] = []
    previous: float | None = None
    for name in layers:
        added = "" if previous is None else f"+{report.us(medians[name] - previous)}"
        rows.append((name, report.us(report.percentile(wall[name], 0.5)), report.us(medians[name]), added))
        previous = medians[name]
    return report.table(
        f"1d. Where a first execution's CPU goes on {report.database()}",
        ["the same 5 round trips, sent by", "p50", "CPU/call", "CPU added by the layer"],
        rows,
        note="Lookup SELECT, lock SET NX PX, claim INSERT, completion UPDATE (both commits) and the "
        "release EVAL: on the bare driver connections (psycopg or mysqlclient, redis-py); through `store` "
        "and `RedisLock` "
        "(Django's cursor wrapper, the statements' parameters prepared by their fields and bound "
        f"client-side, {_insert_parameters()} for the claim, "
        "and redis-py's command layer); and as a whole first execution (`task(...)`: the task's "
        "request, key and fingerprint, signals, the heartbeat, the result's encoding). Interleaved "
        "blocks, median CPU per block.",
    )


def _insert_parameters() -> str:
    # The claim INSERT's parameter count, read from the statement the store sends.
    sql, _ = store.insert_sql(store.database())
    return f"{sql.count('%s')} parameters"
