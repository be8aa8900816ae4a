"""One topology run: a burst of messages over keys, a fault mid-burst, one more copy of every key, the check.

The deliveries, the two prefork workers and the invariants are the chaos suite's (tests/chaos):
only the workers' settings (where the database and the lock Redis are) and the fault differ.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from django.conf import settings
from django.db import connections

from django_idempotent_tasks.models import IdempotencyRecord
from tests.chaos import checker
from tests.chaos.harness import PlanClock, Sender
from tests.chaos.plan import Plan, Tier, make_plan, seed_from_env, value_of
from tests.chaos.services import WorkerPool
from tests.chaosapp import control
from tests.chaosapp.tasks import LEASE, URGENT, task_for
from tests.helpers import Worker, wait_for

# About 640 messages over 240 keys, half of them atomic=True, a tenth of the keys sent 10 times at
# once, sent over 20 s: the fault strikes mid-burst, at FAULT_AT s.
BURST = Tier(
    name="topology burst",
    keys=240,
    messages=640,
    multi_fraction=0.3,
    burst_keys=10,
    burst_size=10,
    max_deliveries=8,
    send_seconds=20,
    faults={},
)
FAULT_AT = 6.0
#: The promise of bounded waits: no delivery stays in a worker's child this long (every database
#: and Redis wait made for the lease is bounded below the lease).
HANG_BOUND = 2 * LEASE
#: Every key final and every message answered this long after the last copy was sent.
SETTLE_SECONDS = 180


class TopologyPool(WorkerPool):
    """The chaos suite's two prefork workers, each with its own settings (one may sit behind a proxy)."""

    def __init__(self, env: dict[str, str], slots: list[dict[str, str]]) -> None:
        self.slot_env = slots
        super().__init__(env, size=len(slots))

    def _new(self, n: int) -> Worker:
        env = {**self.env, **self.slot_env[n], "DJANGO_SETTINGS_MODULE": "tests.topologies.settings"}
        queues = f"chaos,chaos.urgent,topo{n}"  # topo<n>: what a fault sends to this worker alone
        return Worker(f"topo{n}", env, app="tests.topologies.celery_app", extra=("-Q", queues))


def database_env(database: dict[str, Any]) -> dict[str, str]:
    return {"TOPOLOGIES_DATABASE": json.dumps(database)}


class RunTimes:
    """Samples how long each delivery has been in a child; dead children are left out once gone."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> RunTimes:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        ended = [float(raw) for raw in control.control().lrange("runtimes", 0, -1)]
        self.longest = max([self.longest, *ended])

    def _sample(self) -> None:
        client = control.control()
        while not self.stop.wait(0.5):
            now = time.time()
            for raw, started in client.hgetall("running").items():
                pid = int(checker.text(raw).split()[1])
                if _alive(pid):
                    self.longest = max(self.longest, now - float(started))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Result:
    """What a topology run measured, and what it violated."""

    name: str
    plan: Plan
    verdict: checker.Verdict
    observed: checker.Observed
    faults: dict[str, int]
    longest_run: float
    seconds: float
    logs: list[str]
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        figures = {
            **self.verdict.figures,
            "completions over another claim": len(self.token_violations()),
            "longest delivery in a child (s)": round(self.longest_run, 1),
            "wall time (s)": round(self.seconds),
        }
        title = f"topology {self.name}, seed {self.plan.seed} (replay: CHAOS_SEED={self.plan.seed})"
        return checker.table(title, figures, self.faults) + "".join(f"\n  {note}" for note in self.notes)

    def token_violations(self) -> list[str]:
        """A SUCCEEDED record whose result came from a body of another claim than the record's."""
        found = []
        for key, record in sorted(self.observed.records.items()):
            if record.status != IdempotencyRecord.Status.SUCCEEDED or not isinstance(record.result, dict):
                continue
            if record.result.get("fence") != record.fence:
                found.append(
                    f"{key}: fence {record.fence} completed with the result of fence {record.result.get('fence')}"
                )
        return found


class Fault:
    """The topology's fault, run in a thread from FAULT_AT on; counts what it injected."""

    def __init__(self, strike: Callable[[Fault], None]) -> None:
        self.strike = strike
        self.injected: dict[str, int] = {}
        self.notes: list[str] = []
        self.started = self.ended = 0.0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.send: Sender | None = None
        self.extra_keys: set[str] = set()

    def hold(self, slot: int, count: int = 2, seconds: float = 4) -> list[str]:
        """Send fresh keys (atomic and not) to worker ``slot``; return once its children hold them.

        Each body stops for ``seconds`` once its effects are made (claim, external call, and the
        atomic body's INSERT): the fault then finds holders mid-body whatever the burst was doing,
        and what waits on it afterwards is the package's own work (renewals, the completion).
        """
        assert self.send is not None
        first = 1000 + len(self.extra_keys)
        keys = [f"held-{n}" for n in range(first, first + count)]
        for key in keys:
            control.arm("after_effect", key, f"hold:{seconds}")
            self.send(task_for(key), key, (value_of(key),), queue=f"topo{slot}")
        self.extra_keys.update(keys)
        wait_for(
            lambda: all(control.control().exists(f"held:{key}") for key in keys),
            timeout=60,
            what=f"worker {slot} to hold {keys} mid-body",
        )
        self.count("keys held mid-body", count)
        return keys

    def resend_held(self) -> int:
        """One more copy of every key a child runs now, on the urgent queue (ahead of the backlog).

        Sent once the holders' leases ran out, these copies find the keys' records with no live
        lease: they take over while the old holders are still cut off or paused.
        """
        assert self.send is not None
        running = {checker.text(raw).split()[0] for raw in control.control().hkeys("running")}
        keys = sorted({key for task_id, key in list(self.send.messages) if task_id in running})
        for key in keys:
            self.send(task_for(key), key, (value_of(key),), queue=URGENT)
        self.count("copies of held keys", len(keys))
        return len(keys)

    def count(self, kind: str, n: int = 1) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + n

    def _run(self) -> None:
        self.started = time.time()
        try:
            self.strike(self)
        except BaseException as exc:  # a broken injector must fail the run, not hide in a thread
            self.error = exc
        finally:
            self.ended = time.time()
            connections.close_all()


def run(
    name: str,
    env: dict[str, str],
    slots: list[dict[str, str]],
    fault: Fault,
    explained_by_fault: bool,
    capsys: Any,
) -> Result:
    """The burst, the fault mid-burst, one more copy of every key, then the chaos checker's verdict."""
    started = time.monotonic()
    plan = make_plan(BURST, seed_from_env())
    pool = TopologyPool(env, slots)
    send = Sender()
    fault.send = send
    with capsys.disabled():
        print(f"\ntopology {name}: seed {plan.seed} (replay with CHAOS_SEED={plan.seed})", flush=True)
    try:
        pool.start()
        with RunTimes() as runtimes:
            clock = PlanClock(redis.Redis.from_url(settings.CELERY_BROKER_URL))
            sends = list(plan.sends)
            launched = False
            while sends or not launched:
                now = clock.now()
                while sends and sends[0][0] <= now:
                    key = sends.pop(0)[1]
                    send(task_for(key), key, (value_of(key),))
                if now >= FAULT_AT and not launched:
                    fault.thread.start()
                    launched = True
                time.sleep(0.02)
            fault.thread.join(timeout=300)
            assert not fault.thread.is_alive(), f"the fault of {name} hung"
            if fault.error is not None:
                raise AssertionError(f"the fault of {name} failed: {fault.error!r}") from fault.error
            keys = set(plan.keys) | fault.extra_keys
            for key in sorted(keys):  # one more copy of every key, after the fault
                send(task_for(key), key, (value_of(key),))
            observed = checker.Observed(keys=keys, poison=set(), messages=send.messages)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: checker.settled(observed), timeout=SETTLE_SECONDS, what="settling")
        pool.stop()  # a still world: records and effects are read in one consistent state
        connections.close_all()
        checker.observe(observed, control.control())
        # Bodies in flight when the fault struck may run again (rolled back, or taken over once
        # their lease ran out): the fault's window explains their extra external calls.
        windows = [(fault.started, fault.ended)] if explained_by_fault else []
        verdict = checker.check(observed, set(), set(), set(), windows)
        return Result(
            name,
            plan,
            verdict,
            observed,
            fault.injected,
            runtimes.longest,
            time.monotonic() - started,
            pool.logs(),
            fault.notes,
        )
    finally:
        pool.stop()


def report(result: Result, capsys: Any) -> None:
    with capsys.disabled():
        print(result.table(), flush=True)


def failures(result: Result, bounded: bool) -> list[str]:
    """The chaos invariants, the claim token, and (where promised) the bound on every wait."""
    found = result.verdict.violations + [f"token {v}" for v in result.token_violations()]
    if bounded and result.longest_run >= HANG_BOUND:
        found.append(
            f"hang: a delivery stayed {result.longest_run:.1f} s in a worker's child "
            f"(bound {HANG_BOUND} s: every wait made for the lease must be shorter than the lease)"
        )
    return found


def assert_held(result: Result, bounded: bool) -> None:
    found = failures(result, bounded)
    assert not found, (
        f"{len(found)} violations in topology {result.name}:\n"
        + "\n".join(found[:40])
        + f"\n{result.table()}\nworker logs: {result.logs}"
    )


@contextlib.contextmanager
def default_database(overrides: dict[str, Any]) -> Iterator[None]:
    """Point this process's default connection at a topology's database for the checker, then back."""
    connection = connections["default"]
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(overrides)
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
