"""Section 2: throughput with a Redis broker and real workers, each system next to plain Celery."""

from __future__ import annotations

import random
import sys
import time
import uuid
from collections import defaultdict
from typing import Any

import redis

from benchmarks import database, report, settings, systems
from benchmarks.celery_app import app
from benchmarks.verdicts import Outcome, Target, losses, noop_target, verdict, work_target
from benchmarks.workers import IDLE_QUEUE, QUEUE, Worker
from django_idempotent_tasks.models import IdempotencyRecord

SYSTEMS: list[tuple[str, Any]] = [
    ("plain @shared_task", systems.plain),
    ("celery-once QueueOnce", systems.once),
    ("celery-singleton Singleton", systems.singleton),
    ("naive SET NX + done marker", systems.naive),
    ("IdempotentTask", systems.idempotent),
    ("IdempotentTask atomic", systems.idempotent_atomic),
    ("IdempotentTask outbox", systems.idempotent_outbox),
]
IDEMPOTENT = (systems.idempotent, systems.idempotent_atomic, systems.idempotent_outbox)
DUPLICATE_SHARE = 0.3
RUN = uuid.uuid4().hex[:6]  # keys never repeat across invocations: a stale record would replay
MIN_GAP = 20  # a redelivery comes back later: never while its original is still queued next to it
PROGRESS = 5.0  # seconds between two progress lines of a wait
STALL = 30.0  # seconds without the backlog shrinking before a run is declared stuck


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
    if task in IDEMPOTENT:
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
    stats.delete("effects", "failures")
    stage(task, batch, messages, work)
    start = time.perf_counter()
    worker.consume(True)
    seconds = drain(broker, start, worker, f"{task.name} {batch}", len(messages))
    worker.consume(False)
    names = [f"{RUN}-{batch}-{unit}" for unit in sorted({unit for unit, _ in messages})]
    once, duplicates, missing = evidence(task, names, work)
    return Outcome(seconds, len(messages), len(names), once, duplicates, missing)


def evidence(task: Any, names: list[str], work: bool) -> tuple[int, int, int]:
    """Units whose effect exists once, effects beyond a unit's first, units with no effect.

    The 5 ms body counts its effect per unit in Redis. The no-op body leaves none, so each system's
    own trace is read: IdempotentTask's SUCCEEDED records, the naive pattern's done markers, and
    for the others the task failures the worker counted (a no-op body that runs cannot fail).
    """
    stats = systems.stats()
    if work:
        counts = [int(count or 0) for count in stats.hmget("effects", names)]
        once = sum(1 for count in counts if count == 1)
        duplicates = sum(count - 1 for count in counts if count > 1)
        return once, duplicates, sum(1 for count in counts if count == 0)
    if task in IDEMPOTENT:
        succeeded = IdempotencyRecord.objects.filter(status=IdempotencyRecord.Status.SUCCEEDED)
        done = succeeded.filter(task_name=task.name, key__in=names).count()
    elif task is systems.naive:
        done = int(systems.peer_redis().exists(*(f"done:{name}" for name in names)))
    else:
        done = len(names) - min(len(names), int(stats.hget("failures", task.name) or 0))
    return done, 0, len(names) - done


def backlog(broker: redis.Redis) -> tuple[int, int, int]:
    """Messages staged, re-queued (the idle queue, where a delivery sends itself again) and unacked."""
    return broker.llen(QUEUE), broker.llen(IDLE_QUEUE), broker.hlen("unacked")


def drain(broker: redis.Redis, start: float, worker: Worker, what: str, messages: int) -> float:
    """Seconds from ``start`` until nothing is queued or unacked, confirmed 50 ms later (a message
    popped by the worker is briefly in neither place). Prints progress every PROGRESS seconds; when
    the backlog has not shrunk for STALL seconds, stops the run with what is stuck."""
    last_print = shrunk_at = time.monotonic()
    smallest = messages + 1
    while True:
        while any(left := backlog(broker)):
            now = time.monotonic()
            if sum(left) < smallest:
                smallest, shrunk_at = sum(left), now
            if now - last_print >= PROGRESS:
                last_print = now
                print(f"  … {what}: {progress(left, messages)}", file=sys.stderr, flush=True)
            if now - shrunk_at > STALL:
                raise SystemExit(
                    f"benchmarks: {what} made no progress for {STALL:.0f} s on worker {worker.label}: "
                    f"{progress(left, messages)}; the worker's log ({worker.log}) ends with:\n"
                    + worker.tail()
                )
            time.sleep(0.005)
        seconds = time.perf_counter() - start
        time.sleep(0.05)
        if not any(backlog(broker)):
            return seconds


def progress(left: tuple[int, int, int], messages: int) -> str:
    staged, requeued, unacked = left
    done = max(0, messages - staged - requeued - unacked)
    return f"{staged} queued, {requeued} re-queued, {unacked} unacked, {done} of {messages} done"


def run(messages: int, work_messages: int, runs: int) -> str:
    """Both workloads on -P solo and on -P prefork -c 2, systems rotated run after run."""
    database.ready()
    for url in (settings.BROKER_URL, settings.PEER_REDIS_URL, settings.STATS_REDIS_URL):
        redis.Redis.from_url(url).flushdb()  # leftovers of an interrupted run would be measured
    out = []
    for pool, concurrency in (("solo", 1), ("prefork", 2)):
        worker = Worker(pool, concurrency).start()
        try:
            warm_up(worker)
            for work, count in ((False, messages), (True, work_messages)):
                out.append(_workload(worker, work, count, runs))
        finally:
            worker.stop()
    return "\n".join(out)


def warm_up(worker: Worker) -> None:
    """One unit of each system through the worker: a system the worker cannot run stops the run here."""
    for name, task in SYSTEMS:
        for work in (False, True):
            outcome = measure(worker, task, f"warm-{task.name}-{work:d}{worker.pool}", [(0, False)], work)
            if outcome.missing:
                raise SystemExit(
                    f"benchmarks: the worker {worker.label} did not run {name} ({task.name}); "
                    f"its log ({worker.log}) ends with:\n{worker.tail()}"
                )


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
        rows.append(
            [
                name,
                f"{report.median([o.rate for o in outcomes]):,.0f}",
                report.ratio(report.median(ratios[name])),
                f"{min(ratios[name]):.2f}–{max(ratios[name]):.2f}",
                f"{report.median([o.useful_rate for o in outcomes]):,.0f}",
                sum(o.duplicates for o in outcomes) if work else "–",
                sum(o.missing for o in outcomes),
            ]
        )
    header = ["system", "messages/s", "× plain (median)", "× plain (range)", "useful work/s"]
    header += ["duplicate effects", "units never run"]
    note = "Useful work/s counts the units whose effect exists exactly once. Units never run: " + (
        "units with no counted effect."
        if work
        else "no SUCCEEDED record (IdempotentTask), no done marker (naive), or a failed task (others)."
    )
    table = report.table(title, header, rows, note=note)
    return table + "\n" + _targets(results, ratios, work, worker.label)


OURS = ("IdempotentTask", "IdempotentTask atomic")
OUTBOX = "IdempotentTask outbox"
OUTBOX_TARGET = 0.95  # the outbox's worker throughput: at least this share of the same task's without it
PLAIN = SYSTEMS[0][0]
NAIVE = "naive SET NX + done marker"


def _targets(
    results: dict[str, list[Outcome]], ratios: dict[str, list[float]], work: bool, label: str
) -> str:
    """Issue #17's targets for this workload beside the measured figures: met or not met, and why."""
    rows: list[Target] = []
    for name in OURS:
        if work:
            rows.append(work_target(name, results[name], NAIVE, results[NAIVE]))
        else:
            ratio = report.median(ratios[name])
            rows.append(noop_target(name, ratio, results[name], PLAIN, results[PLAIN]))
    rows.append(outbox_target(results))
    cells = [(row.target, row.measured, row.verdict) for row in rows]
    return report.table(f"2. Targets ({label})", ["target", "measured", "verdict"], cells)


def outbox_target(results: dict[str, list[Outcome]]) -> Target:
    """The outbox's worker: within 5 % of IdempotentTask's messages/s (the claim updates the PENDING
    row instead of inserting one), every unit run once; run by run, then the median."""
    ratios = [mine.rate / theirs.rate for mine, theirs in zip(results[OUTBOX], results[OURS[0]], strict=True)]
    ratio = report.median(ratios)
    return Target(
        f"{OUTBOX}: messages/s ≥ {OUTBOX_TARGET}× IdempotentTask's, 0 units lost or run twice",
        f"{ratio:.2f}× (runs {min(ratios):.2f}–{max(ratios):.2f})",
        verdict(
            ratio >= OUTBOX_TARGET,
            losses(OUTBOX, results[OUTBOX]) + losses(OURS[0], results[OURS[0]]),
            f"{ratio:.2f}× IdempotentTask",
        ),
    )
