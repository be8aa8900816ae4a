"""One chaos run: start the services, send the seeded deliveries, strike the faults, check."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from django.db import connections

from tests.chaos import checker
from tests.chaos.faults import INJECTORS, Context
from tests.chaos.outbox_faults import BrokerDrops, Redrive
from tests.chaos.plan import BEFORE_COMPLETION, UNTAKEN, Plan, value_of
from tests.chaos.services import LockRedis, PrivatePostgres, WorkerPool
from tests.chaosapp import control
from tests.chaosapp.tasks import chaos_task_for
from tests.helpers import wait_for
from tests.isolation import free_port

# The schedule waits while more messages than this are queued.
BACKLOG = 150
# I2's bound: every key final this long after the last fault (or the last send).
SETTLE_SECONDS = 60
# How much longer a run that missed the bound waits before it reads the other invariants.
GRACE_SECONDS = 120


@dataclass
class Outcome:
    plan: Plan
    verdict: checker.Verdict
    injected: dict[str, int]
    seconds: float
    logs: list[str]
    notes: list[str]

    def table(self) -> str:
        figures = {**self.verdict.figures, "wall time (s)": round(self.seconds)}
        title = f"chaos {self.plan.tier.name}, seed {self.plan.seed} (replay: CHAOS_SEED={self.plan.seed})"
        notes = "\n".join(f"  {note}" for note in self.notes + self.verdict.notes)
        return f"{checker.table(title, figures, self.injected)}\nfaults:\n{notes}"


class Sender:
    """Sends deliveries with ids chosen up front, so the checker can find every answer.

    An outbox task's send may publish nothing: it attaches to the message already on its way, or
    replays a key that already succeeded (its value is checked against the record, as I3).
    """

    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []
        self.attached = 0
        self.replayed: list[tuple[str, Any]] = []
        self.mutex = threading.Lock()

    def __call__(
        self, task: Any, key: str, args: tuple[Any, ...], queue: str = "chaos", task_id: str = ""
    ) -> str:
        task_id = task_id or str(uuid.uuid4())
        outboxed = task.idempotency_options.effective_outbox
        if not outboxed:
            with self.mutex:
                self.messages.append((task_id, key))
        result = task.apply_async(args, {"idempotency_key": key}, task_id=task_id, queue=queue)
        if outboxed:
            with self.mutex:
                if getattr(result, "replayed", False):
                    self.replayed.append((key, result.result))
                elif result.id == task_id:
                    self.messages.append((task_id, key))
                else:
                    self.attached += 1
        return task_id


class PlanClock:
    """The schedule's time: it stands still while the queue holds a backlog.

    A loaded machine then stretches the run instead of piling up messages that would take longer
    than the settling bound to drain; sends and faults keep their order and spacing.
    """

    def __init__(self, broker: redis.Redis, backlog: int = BACKLOG) -> None:
        self.broker = broker
        self.backlog = backlog
        self.elapsed = 0.0
        self.last = time.monotonic()
        self.checked = 0.0
        self.running = True

    def now(self) -> float:
        real = time.monotonic()
        if real - self.checked > 0.2:
            self.checked = real
            self.running = int(self.broker.llen("chaos")) <= self.backlog
        if self.running:
            self.elapsed += real - self.last
        self.last = real
        return self.elapsed


def strike(ctx: Context, fault: Any, errors: list[str]) -> None:
    try:
        INJECTORS[fault.kind](ctx, fault)
    except BaseException as exc:  # a broken injector must fail the run, not hide in a thread
        errors.append(f"{fault.kind} {fault.key}: {exc!r}")
    finally:
        connections.close_all()


def run(plan: Plan, env: dict[str, str], lock_port: int, postgres: PrivatePostgres | None) -> Outcome:
    """Run ``plan`` against two real workers and return what the checker found."""
    started = time.monotonic()
    lock_redis = LockRedis(lock_port)
    skewed = any(fault.kind in ("skew_ahead", "skew_behind") for fault in plan.faults)
    pool = WorkerPool({**env, "IDEMPOTENT_TESTS_LOCK_REDIS_URL": lock_redis.url}, skewed=skewed)
    send = Sender()
    threads: list[threading.Thread] = []
    errors: list[str] = []
    drops = BrokerDrops()
    redrive = Redrive()
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(drops.installed())
        lock_redis.start()
        pool.start()
        redrive.start()
        ctx = Context(pool, lock_redis, send, postgres, drops)
        timed = []
        for fault in plan.faults:
            if fault.at == 0:
                INJECTORS[fault.kind](ctx, fault)  # armed before the first send
            else:
                timed.append(fault)
        clock = PlanClock(redis.Redis.from_url(settings.CELERY_BROKER_URL))
        sends = list(plan.sends)
        while sends or timed:
            now = clock.now()
            while sends and sends[0][0] <= now:
                key = sends.pop(0)[1]
                send(chaos_task_for(key), key, (value_of(key),))
            while timed and timed[0].at <= now:
                thread = threading.Thread(target=strike, args=(ctx, timed.pop(0), errors), daemon=True)
                thread.start()
                threads.append(thread)
            time.sleep(0.02)
        last_send = time.monotonic()
        for thread in threads:
            thread.join(timeout=300)
            assert not thread.is_alive(), "a fault injector hung"
        assert not errors, f"fault injectors failed: {errors}"
        bound = max(ctx.last_end, last_send) + SETTLE_SECONDS
        keys = set(plan.keys) | {f.key for f in plan.faults if f.kind in ("short_lock", "poison")}
        poison = {f.key for f in plan.faults if f.kind == "poison"}
        observed = checker.Observed(
            keys=keys,
            poison=poison,
            messages=send.messages,
            replayed=send.replayed,
            attached=send.attached,
            dropped=list(drops.dropped),
        )
        with contextlib.suppress(AssertionError):
            wait_for(lambda: checker.settled(observed), timeout=bound - time.monotonic(), what="settling")
        late = checker.unsettled(observed, control.control())
        if late:
            # Already a violation of I2; let the rest finish so the other invariants can be read.
            with contextlib.suppress(AssertionError):
                wait_for(lambda: checker.settled(observed), timeout=GRACE_SECONDS, what="settling")
        redrive.stop()
        pool.stop()  # a still world: records and effects are read in one consistent state
        connections.close_all()
        checker.observe(observed, control.control())
        observed.redriven = len(redrive.sent)
        taken_over = {
            f.key
            for f in plan.faults
            if (f.kind == "child_kill" and f.point in BEFORE_COMPLETION) or f.kind == "stale_row"
        } | ctx.cut_off
        untaken = {f.key for f in plan.faults if f.kind in UNTAKEN}
        verdict = checker.check(observed, ctx.stopped, ctx.terminated, taken_over, ctx.restarts, untaken)
        verdict.violations += [f"I2 {key}: not final {SETTLE_SECONDS} s after the last fault" for key in late]
        verdict.figures["keys not final within the bound"] = len(late)
        injected = dict(ctx.injected)
        armed = [f for f in plan.faults if f.kind == "child_kill"]
        injected["child_kill"] = sum(
            1 for f in armed if not control.control().exists(f"point:{f.point}:{f.key}")
        )
        return Outcome(plan, verdict, injected, time.monotonic() - started, pool.logs(), ctx.notes)
    finally:
        for thread in threads:
            thread.join(timeout=60)
        if redrive.is_alive():
            redrive.stop()
        pool.stop()
        lock_redis.stop()
        stack.close()


def lock_port() -> int:
    """CHAOS_LOCK_REDIS_PORT, else a free port: two runs on one machine each get their own."""
    return int(os.environ.get("CHAOS_LOCK_REDIS_PORT") or free_port())


def run_and_check(
    plan: Plan, name: str, env: dict[str, str], capsys: Any, postgres: PrivatePostgres | None = None
) -> None:
    """Run ``plan``, print its seed and table (uncaptured), and fail on any violated invariant."""
    with capsys.disabled():
        print(f"\nchaos {name}: seed {plan.seed} (replay with CHAOS_SEED={plan.seed})", flush=True)
    outcome = run(plan, env, lock_port(), postgres=postgres)
    with capsys.disabled():
        print(outcome.table(), flush=True)
    assert not outcome.verdict.violations, (
        f"{len(outcome.verdict.violations)} violations (seed {plan.seed}):\n"
        + "\n".join(outcome.verdict.violations[:50])
        + f"\n{outcome.table()}\nworker logs: {outcome.logs}"
    )
