"""Section 1e: what one enqueue costs the caller, with and without the outbox."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable

import redis
from django.db import transaction

from benchmarks import database, report, settings
from benchmarks.overhead import interleaved
from benchmarks.roundtrips import RoundTrips, counting
from benchmarks.systems import idempotent, idempotent_outbox, plain
from django_idempotent_tasks import store

#: Where the enqueues go: a queue no worker consumes, emptied after every block.
QUEUE = "bench.enqueue"


def paths() -> dict[str, Callable[[], object]]:
    """Each way of sending, on keys it has never seen (or, for attach and replay, on one it has)."""
    counter = itertools.count()
    run = uuid.uuid4().hex[:6]

    def key(prefix: str) -> str:
        return f"{run}-{prefix}-{next(counter)}"

    idempotent_outbox.apply_async(("attach", False), {"idempotency_key": f"{run}-attach"}, queue=QUEUE)
    idempotent_outbox.apply_async(("replay", False), {"idempotency_key": f"{run}-replay"}, queue=QUEUE)
    store.records().filter(key=f"{run}-replay").update(status="SUCCEEDED", message=None, result=None)

    def in_transaction() -> object:
        with transaction.atomic():
            return idempotent_outbox.apply_async(("u", False), {"idempotency_key": key("tx")}, queue=QUEUE)

    return {
        "plain Celery apply_async": lambda: plain.apply_async(("u", False), queue=QUEUE),
        "IdempotentTask apply_async": lambda: idempotent.apply_async(
            ["u", False], {"idempotency_key": key("plain")}, queue=QUEUE
        ),
        "outbox, new key (autocommit)": lambda: idempotent_outbox.apply_async(
            ["u", False], {"idempotency_key": key("new")}, queue=QUEUE
        ),
        "outbox, new key in the caller's transaction": in_transaction,
        "outbox, key on its way (attach)": lambda: idempotent_outbox.apply_async(
            ["attach", False], {"idempotency_key": f"{run}-attach"}, queue=QUEUE
        ),
        "outbox, key SUCCEEDED (replay)": lambda: idempotent_outbox.apply_async(
            ["replay", False], {"idempotency_key": f"{run}-replay"}, queue=QUEUE
        ),
    }


def run(calls: int, rounds: int = 10) -> str:
    """Every path's p50, p95 and CPU per enqueue, interleaved; its round trips and commits counted."""
    database.ready()
    broker = redis.Redis.from_url(settings.BROKER_URL)
    named = paths()
    before = report.load()
    try:
        wall, cpu = interleaved(named, calls, rounds)
    finally:
        broker.delete(QUEUE)
    after = report.load()
    trips: dict[str, RoundTrips] = {}
    for name, call in named.items():
        with counting() as counts:
            call()
        trips[name] = counts
    broker.delete(QUEUE)
    base = report.percentile(wall["IdempotentTask apply_async"], 0.5)
    rows = [
        (
            name,
            report.us(report.percentile(wall[name], 0.5)),
            report.us(report.percentile(wall[name], 0.95)),
            report.us(report.median(cpu[name])),
            trips[name].describe(),
            str(trips[name].commits),
            report.ratio(report.percentile(wall[name], 0.5) / base),
        )
        for name in named
    ]
    return report.table(
        f"1e. The caller's cost of one enqueue on {report.database()} ({calls} calls each, "
        f"{before} before, {after} after)",
        ["enqueue", "p50", "p95", "CPU/call", "round trips", "commits", "× IdempotentTask p50"],
        rows,
        note="apply_async to a Redis queue no worker consumes (the publish itself is in every row but "
        "attach and replay, which publish nothing). Round trips are the records' database and the lock "
        "Redis (the broker's one LPUSH is not counted); commits: round trips that commit. The outbox's "
        "new key reads the record, inserts it PENDING (autocommit: its own commit) and publishes; in "
        "the caller's transaction the INSERT joins it and the publish follows its commit (the row's "
        "BEGIN and COMMIT are the caller's, which it pays anyway).",
    )
