"""The fault injectors: each strikes once, as the plan says, and writes down what it hit."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connections
from django.utils import timezone

from django_idempotent_tasks import keys
from django_idempotent_tasks.models import IdempotencyRecord
from tests import db_sessions
from tests.chaos import guarantee_faults, outbox_faults
from tests.chaos.plan import Fault
from tests.chaos.services import LockRedis, PrivatePostgres, WorkerPool, children, kill_group
from tests.chaosapp import control
from tests.chaosapp.tasks import LEASE, URGENT, chaos_effect, chaos_slow, task_for
from tests.helpers import wait_for

T = TypeVar("T")


class Context:
    """What the injectors act on, and what they write down for the checker."""

    def __init__(
        self,
        pool: WorkerPool,
        lock_redis: LockRedis,
        send: Callable[..., str],
        postgres: PrivatePostgres | None,
        drops: outbox_faults.BrokerDrops | None = None,
    ) -> None:
        self.pool = pool
        self.drops = drops or outbox_faults.BrokerDrops()
        self.lock_redis = lock_redis
        # Faults send to the urgent queue: their timing must not wait behind the backlog.
        self.send = functools.partial(send, queue=URGENT)
        self.postgres = postgres
        self.control = control.control()
        self.redis_faults = threading.Lock()
        self.mutex = threading.Lock()
        self.injected: dict[str, int] = {}
        self.stopped: set[int] = set()
        self.terminated: set[str] = set()
        self.cut_off: set[str] = set()
        self.restarts: list[tuple[float, float]] = []
        self.notes: list[str] = []
        self.last_end = 0.0

    def done(self, kind: str, note: str) -> None:
        with self.mutex:
            self.injected[kind] = self.injected.get(kind, 0) + 1
            self.notes.append(f"{kind}: {note}")
            self.last_end = max(self.last_end, time.monotonic())

    def holder(self, key: str) -> list[int]:
        """The pid (and PostgreSQL backend pid) published by the process holding ``key``."""
        value = wait_for(lambda: self.control.get(f"held:{key}"), timeout=90, what=f"a holder of {key}")
        return [int(part) for part in value.split()]


def terminate(backend: int) -> bool:
    return db_sessions.terminate(backend)


def with_database(fn: Callable[[], T]) -> T:
    """Run ``fn``, reconnecting while a PostgreSQL restart (another fault) is under way."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return fn()
        except (OperationalError, InterfaceError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
        finally:
            connections.close_all()


def arm_child_kill(ctx: Context, fault: Fault) -> None:
    control.arm(fault.point, fault.key, "kill")


def insert_stale_row(ctx: Context, fault: Fault) -> None:
    """P6: an IN_PROGRESS row whose holder vanished long ago."""
    value, task = int(fault.key.rsplit("-", 1)[1]), task_for(fault.key)
    IdempotencyRecord.objects.create(
        scope=task.name,
        key=fault.key,
        task_name=task.name,
        fingerprint=task.idempotency_spec.prepare((value,), {"idempotency_key": fault.key}).fingerprint,
        task_id="stale",
        worker="gone:1",
        started_at=timezone.now() - timedelta(hours=1),
        lease_expires_at=timezone.now() - timedelta(minutes=30),
    )
    ctx.done("stale_row", fault.key)


def pause(ctx: Context, fault: Fault) -> None:
    """W6: SIGSTOP the holder mid-body until a duplicate takes the key over, then SIGCONT it."""
    hold(ctx, fault.key, 4)
    pid = ctx.holder(fault.key)[0]
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    with ctx.mutex:
        ctx.stopped.add(pid)
    ctx.send(chaos_effect, fault.key, (int(fault.key.rsplit("-", 1)[1]),))
    # At most 12 s, so the stopped task stays inside its 20 s hard time limit.
    taken = with_database(lambda: taken_over(fault.key, timeout=12))
    time.sleep(max(0.0, LEASE + 1 - (time.monotonic() - stopped_at)))
    with contextlib.suppress(ProcessLookupError):  # a worker fault may have killed it meanwhile
        os.kill(pid, signal.SIGCONT)
    took = "a duplicate took over" if taken else "no duplicate took over"
    ctx.done("pause", f"{fault.key} pid {pid} stopped {time.monotonic() - stopped_at:.0f} s; {took}")


def taken_over(key: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if IdempotencyRecord.objects.filter(key=key, fence__gte=2).exists():
            return True
        time.sleep(0.1)
    return False


def backend_kill(ctx: Context, fault: Fault) -> None:
    """P1: pg_terminate_backend() of the holder's connection inside its atomic body."""
    control.arm("after_effect", fault.key, "hold:3")
    ctx.send(chaos_effect, fault.key, (int(fault.key.rsplit("-", 1)[1]),))
    pid, backend = ctx.holder(fault.key)
    with ctx.mutex:
        ctx.terminated.add(fault.key)
    killed = with_database(lambda: terminate(backend))
    # On a very slow machine the holder may have left its body first: then nothing was cut off.
    if killed and ctx.control.exists(f"held:{fault.key}"):
        with ctx.mutex:
            ctx.cut_off.add(fault.key)
    where = "mid-body" if fault.key in ctx.cut_off else "after the body"
    ctx.done("backend_kill", f"{fault.key} backend {backend} of pid {pid} terminated {where}")


def short_lock(ctx: Context, fault: Fault) -> None:
    """W7: a 5 s body under a 2 s lock TTL, and a duplicate 3 s in."""
    ctx.send(chaos_slow, fault.key, (0, 5))
    ctx.holder(fault.key)
    time.sleep(3)
    ctx.send(chaos_slow, fault.key, (0, 5))
    ctx.done("short_lock", fault.key)


def poison(ctx: Context, fault: Fault) -> None:
    """W9: a task that kills its process every time; it must end FAILED."""
    from tests.chaosapp.tasks import chaos_poison

    ctx.send(chaos_poison, fault.key, (0,))
    ctx.done("poison", fault.key)


def main_kill(ctx: Context, fault: Fault) -> None:
    """W4: SIGKILL the main worker process; its orphaned children die with their group."""
    with ctx.pool.locks[fault.worker]:
        worker = ctx.pool.slots[fault.worker]
        victims = children(worker.pid)
        for pid in victims:
            control.died(pid)
        os.kill(worker.pid, signal.SIGKILL)
        time.sleep(1)
        kill_group(worker.pid)
        assert worker.process is not None
        worker.process.wait(timeout=30)
        worker.log_file.close()
        time.sleep(2)
        ctx.pool.restart(fault.worker)
    ctx.done("main_kill", f"worker {fault.worker} pid {worker.pid}, children {victims}")


def warm_shutdown(ctx: Context, fault: Fault) -> None:
    """W5: SIGTERM, SIGKILL the group if it is still there 2 s later, then restart."""
    with ctx.pool.locks[fault.worker]:
        worker = ctx.pool.slots[fault.worker]
        assert worker.process is not None
        victims = children(worker.pid)
        os.kill(worker.pid, signal.SIGTERM)
        try:
            worker.process.wait(timeout=2)
            how = "stopped warm"
        except Exception:
            for pid in victims:
                control.died(pid)
            kill_group(worker.pid)
            worker.process.wait(timeout=30)
            how = "SIGKILLed after 2 s"
        worker.log_file.close()
        ctx.pool.restart(fault.worker)
    ctx.done("warm_shutdown", f"worker {fault.worker} {how}")


def hold(ctx: Context, key: str, seconds: float) -> None:
    """Send ``key`` and return once its holder sits inside the body (lock and lease held)."""
    control.arm("after_effect", key, f"hold:{seconds}")
    ctx.send(chaos_effect, key, (int(key.rsplit("-", 1)[1]),))
    ctx.holder(key)


def duplicate(ctx: Context, key: str) -> str:
    """Send ``key`` again right after a lock fault; say whether the holder's lock survived it."""
    survived = ctx.lock_redis.client().exists(keys.lock_name(chaos_effect.name, key))
    ctx.send(chaos_effect, key, (int(key.rsplit("-", 1)[1]),))
    return f"{key}'s lock {'survived' if survived else 'vanished'}; duplicate sent"


def lock_restart(ctx: Context, fault: Fault) -> None:
    """R1: the lock Redis restarts empty while a holder is mid-body."""
    hold(ctx, fault.key, 3)
    with ctx.redis_faults:
        ctx.lock_redis.restart_without_persistence()
        note = duplicate(ctx, fault.key)
    ctx.done("lock_restart", f"SHUTDOWN NOSAVE and restart; {note}")


def client_pause(ctx: Context, fault: Fault) -> None:
    with ctx.redis_faults:
        ctx.lock_redis.client().execute_command("CLIENT", "PAUSE", 3000, "ALL")  # type: ignore[no-untyped-call]
        time.sleep(3)
    ctx.done("client_pause", "CLIENT PAUSE 3000 ALL")


def eviction(ctx: Context, fault: Fault) -> None:
    """R5: maxmemory 2mb, allkeys-random, and a flood of keys evicts the locks."""
    hold(ctx, fault.key, 4)
    with ctx.redis_faults:
        evicted = ctx.lock_redis.storm()
        note = duplicate(ctx, fault.key)
        ctx.lock_redis.calm()
    ctx.done("eviction", f"{evicted} keys evicted; {note}")


def clock_jump(ctx: Context, fault: Fault) -> None:
    """R7: every lock key expires at once, as if the Redis clock jumped forward."""
    hold(ctx, fault.key, 3)
    with ctx.redis_faults:
        expired = ctx.lock_redis.expire_locks()
        time.sleep(0.01)
        note = duplicate(ctx, fault.key)
    ctx.done("clock_jump", f"{expired} lock keys expired; {note}")


def pg_restart(ctx: Context, fault: Fault) -> None:
    assert ctx.postgres is not None, "pg_restart needs the soak's private PostgreSQL"
    started = time.time()
    ctx.postgres.restart()
    connections.close_all()
    with ctx.mutex:
        ctx.restarts.append((started, time.time()))
    ctx.done("pg_restart", "pg_ctl restart -m fast")


INJECTORS: dict[str, Callable[[Context, Fault], None]] = {
    "skew_ahead": guarantee_faults.skew_ahead,
    "skew_behind": guarantee_faults.skew_behind,
    "connection_cut": guarantee_faults.connection_cut,
    "refused_value": guarantee_faults.refused_value,
    "broker_drop": outbox_faults.broker_drop,
    "child_kill": arm_child_kill,
    "stale_row": insert_stale_row,
    "pause": pause,
    "backend_kill": backend_kill,
    "short_lock": short_lock,
    "poison": poison,
    "main_kill": main_kill,
    "warm_shutdown": warm_shutdown,
    "lock_restart": lock_restart,
    "client_pause": client_pause,
    "eviction": eviction,
    "clock_jump": clock_jump,
    "pg_restart": pg_restart,
}
