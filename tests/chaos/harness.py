"""One chaos run: start the services, send the seeded deliveries, strike the faults, check."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connections

from tests.chaos import checker
from tests.chaos.faults import INJECTORS, Context
from tests.chaos.plan import BEFORE_COMPLETION, Plan, value_of
from tests.chaos.services import LockRedis, PrivatePostgres, WorkerPool
from tests.chaosapp import control
from tests.chaosapp.tasks import chaos_effect
from tests.helpers import wait_for

# I2's bound: every key final this long after the last fault (or the last send).
SETTLE_SECONDS = 60


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
        notes = "\n".join(f"  {note}" for note in self.notes)
        return f"{checker.table(title, figures, self.injected)}\nfaults:\n{notes}"


class Sender:
    """Sends deliveries with ids chosen up front, so the checker can find every answer."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []
        self.mutex = threading.Lock()

    def __call__(self, task: Any, key: str, args: tuple[Any, ...], queue: str = "chaos") -> str:
        task_id = str(uuid.uuid4())
        with self.mutex:
            self.messages.append((task_id, key))
        task.apply_async(args, {"idempotency_key": key}, task_id=task_id, queue=queue)
        return task_id


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
    pool = WorkerPool({**env, "IDEMPOTENT_TESTS_LOCK_REDIS_URL": lock_redis.url})
    send = Sender()
    threads: list[threading.Thread] = []
    errors: list[str] = []
    try:
        lock_redis.start()
        pool.start()
        ctx = Context(pool, lock_redis, send, postgres)
        timed = []
        for fault in plan.faults:
            if fault.at == 0:
                INJECTORS[fault.kind](ctx, fault)  # armed before the first send
            else:
                timed.append(fault)
        t0 = time.monotonic()
        sends = list(plan.sends)
        while sends or timed:
            now = time.monotonic() - t0
            while sends and sends[0][0] <= now:
                key = sends.pop(0)[1]
                send(chaos_effect, key, (value_of(key),))
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
        observed = checker.Observed(keys=keys, poison=poison, messages=send.messages)
        # Past the bound the checker names every key and message that did not settle.
        with contextlib.suppress(AssertionError):
            wait_for(lambda: checker.settled(observed), timeout=bound - time.monotonic(), what="settling")
        connections.close_all()
        checker.observe(observed, control.control())
        taken_over = {
            f.key
            for f in plan.faults
            if (f.kind == "child_kill" and f.point in BEFORE_COMPLETION)
            or f.kind in ("backend_kill", "stale_row")
        }
        verdict = checker.check(observed, ctx.stopped, ctx.terminated, taken_over, ctx.restarts)
        injected = dict(ctx.injected)
        armed = [f for f in plan.faults if f.kind == "child_kill"]
        injected["child_kill"] = sum(
            1 for f in armed if not control.control().exists(f"point:{f.point}:{f.key}")
        )
        return Outcome(plan, verdict, injected, time.monotonic() - started, pool.logs(), ctx.notes)
    finally:
        for thread in threads:
            thread.join(timeout=60)
        pool.stop()
        lock_redis.stop()


def lock_port() -> int:
    return int(os.environ.get("CHAOS_LOCK_REDIS_PORT", "6406"))
