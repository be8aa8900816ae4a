"""Section 2: throughput with a Redis broker and real workers, each system next to plain Celery."""

from __future__ import annotations

import random
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import redis

from benchmarks import report, settings, systems
from benchmarks.celery_app import app
from benchmarks.workers import IDLE_QUEUE, QUEUE, Worker

SYSTEMS: list[tuple[str, Any]] = [
    ("plain @shared_task", systems.plain),
    ("celery-once QueueOnce", systems.once),
    ("celery-singleton Singleton", systems.singleton),
    ("naive SET NX + done marker", systems.naive),
    ("IdempotentTask", systems.idempotent),
    ("IdempotentTask atomic", systems.idempotent_atomic),
]
DUPLICATE_SHARE = 0.3
RUN = uuid.uuid4().hex[:6]  # keys never repeat across invocations: a stale record would replay
MIN_GAP = 20  # a redelivery comes back later: never while its original is still queued next to it


@dataclass
class Outcome:
    seconds: float
    messages: int
    units: int
    runs: int = 0  # body executions that left a side effect
    covered: int = 0  # units whose effect exists


def plan(messages: int, duplicates: bool, seed: int) -> list[tuple[int, bool]]:
    """The order of (unit, is a redelivered duplicate) messages, the same for every system of a run."""
    if not duplicates:
        return [(unit, False) for unit in range(messages)]
    rng = random.Random(seed)
    units = round(messages * (1 - DUPLICATE_SHARE))
    order: list[tuple[float, int, bool]] = [(float(unit), unit, False) for unit in range(units)]
    for unit in rng.sample(range(units), messages - units):
        start = unit + MIN_GAP
        order.append((start + rng.random() * max(1, units - start), unit, True))
    return [(unit, dup) for _, unit, dup in sorted(order)]


def _call(task: Any, batch: str, unit: int, work: bool) -> tuple[list[Any], dict[str, Any]]:
    name = f"{RUN}-{batch}-{unit}"
    if task is systems.naive:
        return [name, work, name], {}
    if task in (systems.idempotent, systems.idempotent_atomic):
        return [name, work], {"idempotency_key": name}
    return [name, work], {}


def stage(task: Any, batch: str, messages: list[tuple[int, bool]], work: bool) -> None:
    """Queue the batch: originals through the system's own apply_async (its enqueue-time checks),
    duplicates as the broker redelivers them: the same message again, past any enqueue check."""
    ids: dict[int, str] = {}
    with app.producer_or_acquire() as producer:
        for unit, duplicate in messages:
            args, kwargs = _call(task, batch, unit, work)
            if duplicate:
                app.send_task(task.name, args, kwargs, task_id=ids[unit], queue=QUEUE, producer=producer)
            else:
                ids[unit] = task.apply_async(args, kwargs, queue=QUEUE, producer=producer).id


def measure(worker: Worker, task: Any, batch: str, messages: list[tuple[int, bool]], work: bool) -> Outcome:
    broker = redis.Redis.from_url(settings.BROKER_URL)
    stats = systems.stats()
    stats.delete("effects")
    stage(task, batch, messages, work)
    start = time.perf_counter()
    worker.consume(True)
    seconds = drain(broker, start)
    worker.consume(False)
    effects = [int(v) for v in stats.hvals("effects")]
    units = len({unit for unit, _ in messages})
    return Outcome(seconds, len(messages), units, sum(effects), len(effects))


def drain(broker: redis.Redis, start: float) -> float:
    """Seconds from ``start`` until nothing is queued or unacked, confirmed 50 ms later (a message
    popped by the worker is briefly in neither place)."""
    while True:
        while broker.llen(QUEUE) or broker.llen(IDLE_QUEUE) or broker.hlen("unacked"):
            time.sleep(0.005)
        seconds = time.perf_counter() - start
        time.sleep(0.05)
        if not (broker.llen(QUEUE) or broker.llen(IDLE_QUEUE) or broker.hlen("unacked")):
            return seconds


def run(messages: int, work_messages: int, runs: int) -> str:
    """Both workloads on -P solo and on -P prefork -c 2, systems rotated run after run."""
    for url in (settings.BROKER_URL, settings.PEER_REDIS_URL, settings.STATS_REDIS_URL):
        redis.Redis.from_url(url).flushdb()  # leftovers of an interrupted run would be measured
    out = []
    for pool, concurrency in (("solo", 1), ("prefork", 2)):
        worker = Worker(pool, concurrency).start()
        try:
            for work, count in ((False, messages), (True, work_messages)):
                out.append(_workload(worker, work, count, runs))
        finally:
            worker.stop()
    return "\n".join(out)


def _workload(worker: Worker, work: bool, count: int, runs: int) -> str:
    results: dict[str, list[Outcome]] = defaultdict(list)
    ratios: dict[str, list[float]] = defaultdict(list)
    before = report.load()
    for r in range(runs):
        messages = plan(count, work, seed=r)
        order = SYSTEMS[r % len(SYSTEMS) :] + SYSTEMS[: r % len(SYSTEMS)]
        measured = {
            name: measure(worker, task, f"{name[:5]}{r}{work:d}{worker.pool}", messages, work)
            for name, task in order
        }
        plain = measured[SYSTEMS[0][0]]
        for name, outcome in measured.items():
            results[name].append(outcome)
            ratios[name].append(plain.seconds / outcome.seconds)
    after = report.load()
    what = "5 ms body, 30% redelivered duplicates" if work else "no-op body, unique keys"
    title = f"2. {what}, {worker.label}, {count} messages x {runs} runs ({before} before, {after} after)"
    rows = []
    for name, _ in SYSTEMS:
        outcomes = results[name]
        rate = report.median([o.messages / o.seconds for o in outcomes])
        row: list[object] = [
            name,
            f"{rate:,.0f}",
            report.ratio(report.median(ratios[name])),
            f"{min(ratios[name]):.2f}–{max(ratios[name]):.2f}",
        ]
        if work:
            useful = report.median([o.units / o.seconds for o in outcomes])
            dupes = sum(o.runs - o.covered for o in outcomes)
            missing = sum(o.units - o.covered for o in outcomes)
            row += [f"{useful:,.0f}", dupes, missing]
        rows.append(row)
    header = ["system", "messages/s", "× plain (median)", "× plain (range)"]
    if work:
        header += ["useful work/s", "duplicate effects", "units never run"]
    return report.table(title, header, rows) + "\n" + _targets(results, ratios, work, worker.label)


OURS = ("IdempotentTask", "IdempotentTask atomic")
NAIVE = "naive SET NX + done marker"


def _targets(
    results: dict[str, list[Outcome]], ratios: dict[str, list[float]], work: bool, label: str
) -> str:
    """Issue #17's targets for this workload beside the measured figures: met or not met."""
    rows = []
    for name in OURS:
        if work:
            ours, naive = (report.median([o.units / o.seconds for o in results[n]]) for n in (name, NAIVE))
            dupes = sum(o.runs - o.covered for o in results[name])
            ok = ours >= naive and dupes == 0
            rows.append(
                (
                    f"{name}: useful work/s ≥ the naive pattern's, 0 duplicate effects",
                    f"{ours:,.0f} vs {naive:,.0f} ({ours / naive:.2f}×), {dupes} duplicates",
                    ok,
                )
            )
        else:
            ratio = report.median(ratios[name])
            rows.append((f"{name}: no-op ≥ 0.6× plain", report.ratio(ratio), ratio >= 0.6))
    cells = [(target, measured, "met" if ok else "not met") for target, measured, ok in rows]
    return report.table(f"2. Targets ({label})", ["target", "measured", "verdict"], cells)
