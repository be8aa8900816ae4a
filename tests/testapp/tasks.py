"""Sample tasks of the test suite. Each execution of a body writes an ``Effect`` row (``effect()``)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import time
from collections.abc import Callable
from typing import Any

from celery import shared_task
from celery.exceptions import Ignore, Reject
from celery.signals import before_task_publish, task_failure, task_postrun, task_retry
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F
from django.dispatch import receiver

from django_idempotent_tasks import signals
from django_idempotent_tasks.decorators import idempotent
from django_idempotent_tasks.idempotency import current
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.tasks import CONFLICTS_HEADER, IdempotentTask
from tests import db_sessions
from tests.testapp.faults import control, reached
from tests.testapp.models import Effect


def effect(task: Any, value: Any, sleep: float = 0) -> dict[str, Any]:
    """The sample body: an external call, an ``Effect`` row, a kill point, then ``sleep`` seconds."""
    idem = task.idempotency
    control().set(f"pid:{idem.key}", os.getpid())
    control().incr(f"calls:{idem.key}")  # an external call: it survives a rollback
    Effect.objects.create(
        key=idem.key, task=task.name, pid=os.getpid(), fence=idem.fence, recovered=idem.recovered
    )
    reached("after_effect", idem.key)
    time.sleep(sleep)
    return {"value": value, "fence": idem.fence}


def effect_failing(task: Any, fail_times: int, error: Callable[[], BaseException]) -> dict[str, Any]:
    """The sample body, then ``error()`` raised on each of the first ``fail_times`` attempts."""
    result = effect(task, fail_times)
    if task.idempotency.attempt <= fail_times:
        raise error()
    return result


@shared_task(base=IdempotentTask, bind=True, ignore_result=True)
def record_effect(self: Any, value: Any, sleep: float = 0) -> dict[str, Any]:
    return effect(self, value, sleep)


@shared_task(base=IdempotentTask, bind=True, atomic=True, ignore_result=True)
def atomic_effect(self: Any, value: Any, sleep: float = 0) -> dict[str, Any]:
    return effect(self, value, sleep)


@shared_task(base=IdempotentTask, bind=True, lock_ttl=2, ignore_result=True)
def short_lease(self: Any, value: Any, sleep: float = 0) -> dict[str, Any]:
    return effect(self, value, sleep)


@shared_task(base=IdempotentTask, bind=True, lock_ttl=2, atomic=True, ignore_result=True)
def short_lease_atomic(self: Any, value: Any, sleep: float = 0) -> dict[str, Any]:
    return effect(self, value, sleep)


@shared_task(base=IdempotentTask, bind=True, idempotency_key="order-{order_id}")
def charge_order(self: Any, order_id: int, amount: int = 100) -> dict[str, Any]:
    return effect(self, amount)


@shared_task(base=IdempotentTask, bind=True, idempotency_key=lambda order_id: f"callable-{order_id}")
def charge_order_callable(self: Any, order_id: int) -> dict[str, Any]:
    return effect(self, order_id)


@shared_task(base=IdempotentTask, bind=True, idempotency_scope="shared")
def shared_scope_a(self: Any, value: Any) -> dict[str, Any]:
    return effect(self, value)


@shared_task(base=IdempotentTask, bind=True, idempotency_scope="shared")
def shared_scope_b(self: Any, value: Any) -> dict[str, Any]:
    return effect(self, value)


@shared_task(base=IdempotentTask, bind=True, max_attempts=3)
def failing(self: Any, fail_times: int) -> dict[str, Any]:
    return effect_failing(self, fail_times, lambda: RuntimeError(f"attempt {self.idempotency.attempt} fails"))


@shared_task(base=IdempotentTask, bind=True, max_retries=5, max_attempts=10, ignore_result=True)
def retrying(self: Any, fail_times: int) -> dict[str, Any]:
    return effect_failing(self, fail_times, lambda: self.retry(countdown=0, exc=RuntimeError("try again")))


@shared_task(
    base=IdempotentTask,
    bind=True,
    autoretry_for=(ConnectionError,),
    max_retries=5,
    default_retry_delay=0,
    ignore_result=True,
)
def autoretrying(self: Any, fail_times: int) -> dict[str, Any]:
    return effect_failing(self, fail_times, lambda: ConnectionError("confirmation timed out"))


@shared_task(base=IdempotentTask, bind=True, max_attempts=2, lock_ttl=1, ignore_result=True)
def poison(self: Any) -> None:
    effect(self, None)
    os._exit(1)


@shared_task(base=IdempotentTask, bind=True)
def unstorable(self: Any, kind: str) -> Any:
    effect(self, kind)
    return object() if kind == "object" else "x" * 100_000


@shared_task(base=IdempotentTask, bind=True)
def takes_key(self: Any, value: int, idempotency_key: str) -> str:
    effect(self, value)
    return idempotency_key


@shared_task(base=IdempotentTask, bind=True, on_conflict="raise", ignore_result=True)
def raising_conflict(self: Any, sleep: float) -> dict[str, Any]:
    return effect(self, sleep, sleep)


@shared_task(base=IdempotentTask, bind=True, on_conflict="wait")
def waiting_conflict(self: Any, sleep: float) -> dict[str, Any]:
    return effect(self, sleep, sleep)


@shared_task(base=IdempotentTask, bind=True, on_conflict="wait", lock_ttl=1)
def impatient_wait(self: Any, sleep: float) -> dict[str, Any]:
    return effect(self, sleep, sleep)


@task_postrun.connect
def kill_after_completion(sender: Any = None, kwargs: Any = None, **extra: Any) -> None:
    """W2: die after the record is SUCCEEDED, before the ack."""
    if kwargs and "idempotency_key" in kwargs:
        reached("postrun", kwargs["idempotency_key"])


@shared_task(base=IdempotentTask, bind=True)
def concurrent_effect(self: Any, value: Any, sleep: float = 0.5) -> dict[str, Any]:
    return effect(self, value, sleep)


@shared_task(base=IdempotentTask, bind=True, max_retries=0)
def no_retries(self: Any, sleep: float) -> dict[str, Any]:
    return {**effect(self, sleep, sleep), "retries": self.request.retries}


@shared_task(base=IdempotentTask, bind=True, atomic=True, on_conflict="raise")
def atomic_raising(self: Any, value: Any) -> dict[str, Any]:
    return effect(self, value)


@shared_task(
    base=IdempotentTask,
    bind=True,
    autoretry_for=(ConnectionError,),
    max_retries=3,
    default_retry_delay=0,
    lock_ttl=3,
    ignore_result=True,
)
def place_order(self: Any, order_id: int, failures: int = 0) -> dict[str, Any]:
    """Charge, then confirm; the confirmation times out ``failures`` times."""
    charge = self.idempotency.step("charge", lambda: effect(self, f"charge-{order_id}"))
    reached("after_charge_step", self.idempotency.key)
    if self.idempotency.attempt <= failures:
        raise ConnectionError("confirmation timed out")
    with self.idempotency.step("notify") as step:
        if not step.done:
            step.result = effect(self, f"notify-{order_id}")
    return {"charge": charge, "notify": step.result}


@shared_task(base=IdempotentTask, bind=True, lock_ttl=2, ignore_result=True)
def slow_step(self: Any, sleep: float) -> Any:
    return self.idempotency.step("slow", lambda: effect(self, "slow", sleep))


@shared_task(base=IdempotentTask, bind=True, time_limit=2, ignore_result=True)
def too_slow(self: Any) -> None:
    effect(self, None, sleep=30)


@shared_task(base=IdempotentTask, bind=True)
def unstorable_step(self: Any) -> None:
    self.idempotency.step("bad", lambda: object())
    effect(self, "after the bad step")


@shared_task(base=IdempotentTask, bind=True)
def forgetful_step(self: Any, fail: bool) -> None:
    with self.idempotency.step("write"):
        Effect.objects.create(key="inside", task="step", pid=os.getpid())
        if fail:
            raise RuntimeError("boom")


@shared_task(base=IdempotentTask, bind=True, on_conflict="raise")
def stale_step(self: Any) -> None:
    IdempotencyRecord.objects.filter(key=self.idempotency.key).update(fence=99)
    self.idempotency.step("late", lambda: 1)


@shared_task(base=IdempotentTask, bind=True, max_attempts=1)
def fails_for_good(self: Any, value: int) -> None:
    """tests/test_testing.py: the body runs once, fails, and the key is then exhausted."""
    effect(self, value)
    raise RuntimeError(f"failed with {value}")


@shared_task(base=IdempotentTask, bind=True, ignore_result=True)
def outlives_its_connection(self: Any, sleep: float) -> dict[str, Any]:
    """tests/test_connection_loss.py: the body's connection is cut while it sleeps."""
    db_sessions.cut_when_idle()
    control().incr(f"calls:{self.idempotency.key}")
    time.sleep(sleep)
    return {"fence": self.idempotency.fence}


#: One autoretry of the body's own OperationalError (tests/test_connection_loss.py).
RETRIES_ITS_OWN_ERROR: dict[str, Any] = {
    "autoretry_for": (OperationalError,),
    "max_retries": 1,
    "default_retry_delay": 0,
    "max_attempts": 10,
}


@shared_task(base=IdempotentTask, bind=True, **RETRIES_ITS_OWN_ERROR)
def deadlocks(self: Any) -> None:
    """tests/test_connection_loss.py: the body's own OperationalError, on a healthy connection."""
    control().incr(f"calls:{self.idempotency.key}")
    raise OperationalError("deadlock detected")


@shared_task(base=IdempotentTask, bind=True, **RETRIES_ITS_OWN_ERROR)
def times_out_after_reconnecting(self: Any) -> None:
    """tests/test_connection_loss.py: a long task refreshes its connection, then the server cancels
    its statement (a statement timeout): the body's own OperationalError, on a new connection."""
    control().incr(f"calls:{self.idempotency.key}")
    connection.close()
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SET STATEMENT max_statement_time=0.05 FOR SELECT SLEEP(2)")
        else:
            cursor.execute("SET LOCAL statement_timeout = 50")
            cursor.execute("SELECT pg_sleep(2)")


@idempotent(on_conflict="raise", lock_ttl=5)
def taken_over_inside(value: int) -> int:
    """tests/test_lifecycle.py: an idempotent call whose key another delivery takes over while it runs."""
    claimed = IdempotencyRecord.objects.filter(key=current().key)
    claimed.update(fence=F("fence") + 1, claim_token="taken-over")
    return value


@shared_task(base=IdempotentTask, bind=True, lock_ttl=2)
def calls_a_key_taken_over(self: Any) -> int:
    """tests/test_lifecycle.py: its body's idempotent call loses its own key (LeaseLost)."""
    control().incr(f"calls:{self.idempotency.key}")
    return int(taken_over_inside(1, idempotency_key=f"{self.idempotency.key}-inner"))


REFUSED = {
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "nul": "abc\x00def",
    "surrogate": "abc\udc80def",
}


@shared_task(base=IdempotentTask, bind=True)
def refused_result(self: Any, kind: str) -> Any:
    """tests/test_refused_values.py: returns a value some database refuses."""
    control().incr(f"calls:{self.idempotency.key}")
    return {"ratio": REFUSED[kind]}


@shared_task(base=IdempotentTask, bind=True)
def refused_step(self: Any, kind: str) -> Any:
    """tests/test_refused_values.py: a step returns a value some database refuses."""
    control().incr(f"calls:{self.idempotency.key}")
    return self.idempotency.step("refused", lambda: [REFUSED[kind]])


@shared_task(base=IdempotentTask, bind=True)
def refused_error(self: Any, kind: str) -> Any:
    """tests/test_refused_values.py: fails with a message some database refuses."""
    control().incr(f"calls:{self.idempotency.key}")
    raise RuntimeError(f"bad record: ab{REFUSED[kind]}cd")


@shared_task(base=IdempotentTask, bind=True, atomic=True)
def atomic_step(self: Any) -> Any:
    """tests/test_transactions.py: a step inside the atomic body's transaction."""
    return self.idempotency.step("pay", lambda: control().incr(f"calls:{self.idempotency.key}"))


@shared_task(base=IdempotentTask, bind=True)
def step_in_own_transaction(self: Any) -> Any:
    """tests/test_transactions.py: a step inside the body's own transaction.atomic()."""
    with transaction.atomic():
        return self.idempotency.step("pay", lambda: control().incr(f"calls:{self.idempotency.key}"))


@shared_task(base=IdempotentTask, bind=True, lock_ttl=1, on_conflict="raise")
def notices_lost_lease(self: Any) -> Any:
    """tests/test_transactions.py: another delivery takes the key over while this body sleeps."""
    IdempotencyRecord.objects.filter(key=self.idempotency.key).update(fence=99)
    wait = time.monotonic() + 10
    while not self.idempotency.lease_lost and time.monotonic() < wait:
        time.sleep(0.05)  # the heartbeat renews every lock_ttl / 3 s and finds the fence moved on
    control().set(f"lost:{self.idempotency.key}", int(self.idempotency.lease_lost))
    return self.idempotency.step("after", lambda: control().incr(f"calls:{self.idempotency.key}"))


@shared_task(base=IdempotentTask, bind=True)
def send_receipt(self: Any, charged: Any = None, order_id: int = 0) -> dict[str, Any]:
    return effect(self, order_id)


@shared_task(base=IdempotentTask, bind=True, ignore_result=True)
def hands_on(self: Any, value: int, how: str) -> Any:
    """tests/test_control_flow.py: Celery's control flow from the body."""
    effect(self, value)
    if how == "replace":
        raise self.replace(record_effect.si(value, idempotency_key=self.idempotency.subkey("next")))
    if how == "ignore":
        raise Ignore()
    raise Reject("refused", requeue=False)


# What the workers did, kept in the control Redis for the worker tests (tests/helpers.py reads it).


@receiver(signals.task_replayed)
def count_replays(sender: Any, key: str, **kwargs: Any) -> None:
    control().incr(f"replayed:{key}")
    request = getattr(sender, "request", None)  # a Celery task; a django.tasks function has none
    control().rpush(f"replayed_on:{key}", getattr(request, "hostname", None) or "")


@receiver(signals.lock_conflict)
def record_conflicts(sender: Any, key: str, action: str, **kwargs: Any) -> None:
    control().rpush(f"conflicts:{key}", action)


@receiver(signals.lease_lost)
def record_lost_leases(sender: Any, key: str, fence: int, **kwargs: Any) -> None:
    control().rpush(f"lease_lost:{key}", fence)


@task_failure.connect
def record_failures(sender: Any = None, exception: Any = None, kwargs: Any = None, **extra: Any) -> None:
    if kwargs and "idempotency_key" in kwargs:
        control().rpush(f"errors:{kwargs['idempotency_key']}", type(exception).__name__)


@task_retry.connect
def record_retries(sender: Any = None, request: Any = None, reason: Any = None, **extra: Any) -> None:
    key = (getattr(request, "kwargs", None) or {}).get("idempotency_key")
    if key is not None:
        control().rpush(f"errors:{key}", type(reason).__name__)


if os.environ.get("IDEMPOTENT_TESTS_DEPLOY") == "2":  # tests/test_deploy.py: the next release of the task

    @shared_task(base=IdempotentTask, bind=True, ignore_result=True)
    def deployed(self: Any, value: int, currency: str = "EUR") -> dict[str, Any]:
        return effect(self, f"{value} {currency}")

else:

    @shared_task(base=IdempotentTask, bind=True, ignore_result=True)
    def deployed(self: Any, value: int) -> dict[str, Any]:
        return effect(self, value)


@before_task_publish.connect
def record_requeues(sender: Any = None, headers: Any = None, **kwargs: Any) -> None:
    """tests/test_backoff.py: the countdown and conflict count of every delivery re-queued by a conflict."""
    conflicts = (headers or {}).get(CONFLICTS_HEADER)
    if conflicts is not None and headers.get("eta"):
        delay = (
            datetime.datetime.fromisoformat(headers["eta"]) - datetime.datetime.now(datetime.timezone.utc)
        ).total_seconds()
        control().rpush("requeues", json.dumps([conflicts, delay]))


@dataclasses.dataclass
class Receipt:
    order_id: int


@shared_task(base=IdempotentTask, bind=True)
def returns(self: Any, kind: str) -> Any:
    """tests/test_misuse.py: results the JSON encoder cannot store, and the JSON-friendly fix."""
    effect(self, kind)
    receipt = Receipt(7)
    return {"dataclass": receipt, "set": {1, 2}, "fixed": dataclasses.asdict(receipt)}[kind]


# tests/test_guarantee.py: the holes of issue 25.


def nested(depth: int) -> Any:
    """A list nested ``depth`` levels deep."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@shared_task(base=IdempotentTask, bind=True)
def deep_result(self: Any, depth: int) -> Any:
    """Returns a list nested ``depth`` levels."""
    control().incr(f"calls:{self.idempotency.key}")
    return nested(depth)


@shared_task(base=IdempotentTask, bind=True)
def deep_step(self: Any, depth: int) -> Any:
    """A step returns a list nested ``depth`` levels."""

    def step() -> Any:
        control().incr(f"calls:{self.idempotency.key}")
        return nested(depth)

    return self.idempotency.step("deep", step)


@shared_task(base=IdempotentTask, bind=True)
def tuple_default(self: Any, value: int, sizes: tuple[Any, ...] = (1, (2, 3))) -> dict[str, Any]:
    """A tuple default: passed explicitly, it arrives from the broker as a list."""
    return effect(self, value)


@shared_task(base=IdempotentTask, bind=True, atomic=True)
def breaks_its_transaction(self: Any) -> dict[str, Any]:
    """An atomic body that catches an IntegrityError and goes on: its transaction is broken."""
    result = effect(self, "broken")
    record = IdempotencyRecord.objects.get(key=self.idempotency.key)
    with contextlib.suppress(IntegrityError):
        IdempotencyRecord.objects.create(scope=record.scope, key=record.key, task_name="duplicate")
    return result


@shared_task(base=IdempotentTask, bind=True)
def leaves_autocommit_off(self: Any) -> dict[str, Any]:
    """A non-atomic body that turns autocommit off and returns without committing."""
    transaction.set_autocommit(False)
    return effect(self, "uncommitted")


@shared_task(base=IdempotentTask, bind=True)
def meets_a_busy_sqlite(self: Any, hold: float) -> dict[str, Any]:
    """On SQLite: another writer takes the write lock as the body ends and keeps it ``hold`` seconds."""
    import sqlite3
    import threading

    from django.db import connection

    result = effect(self, "busy")
    taken = threading.Event()

    def writer() -> None:
        other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        taken.set()
        time.sleep(hold)
        other.execute("COMMIT")
        other.close()

    threading.Thread(target=writer, daemon=True).start()
    taken.wait()
    return result


@shared_task(base=IdempotentTask, bind=True, lock_ttl=2, ignore_result=True)
def pauses_between_steps(self: Any, sleep: float) -> Any:
    """Two steps, ``sleep`` seconds apart: the test pauses the process between them."""
    key = self.idempotency.key
    self.idempotency.step("one", lambda: "one")
    control().set(f"between:{key}", os.getpid())
    time.sleep(sleep)

    def second() -> str:
        control().rpush(f"second:{key}", self.idempotency.fence)
        return "two"

    return self.idempotency.step("two", second)


@shared_task(base=IdempotentTask, bind=True, lock_ttl=3, on_conflict="raise", ignore_result=True)
def raising_short_lease(self: Any, value: Any) -> dict[str, Any]:
    """on_conflict="raise" with a 3 s lease: its killed holder's lock and lease run out soon."""
    return effect(self, value)


@shared_task(base=IdempotentTask, bind=True)
def plain_result(self: Any, value: Any) -> dict[str, Any]:
    """tests/test_ambiguous_commit.py: one external call, a plain result."""
    control().incr(f"calls:{self.idempotency.key}")
    return {"value": value}


@shared_task(base=IdempotentTask, bind=True, atomic=True)
def atomic_plain_result(self: Any, value: Any) -> dict[str, Any]:
    """tests/test_ambiguous_commit.py: the same in atomic mode."""
    control().incr(f"calls:{self.idempotency.key}")
    return {"value": value}


@shared_task(base=IdempotentTask, bind=True, lock_ttl=1, on_conflict="raise")
def renewal_blocked(self: Any, hold: float) -> Any:
    """Another transaction locks this key's record for ``hold`` seconds: no renewal can pass."""
    import threading

    from django.db import connection

    key = self.idempotency.key
    locked = threading.Event()

    def holder() -> None:
        with transaction.atomic():
            list(IdempotencyRecord.objects.select_for_update().filter(key=key))
            locked.set()
            time.sleep(hold)
        connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    locked.wait()
    thread.join()
    return self.idempotency.step("after", lambda: control().incr(f"calls:{key}"))


@shared_task(base=IdempotentTask, bind=True, outbox=True, ignore_result=True)
def outbox_effect(self: Any, value: Any, sleep: float = 0) -> dict[str, Any]:
    return effect(self, value, sleep)


@shared_task(base=IdempotentTask, bind=True, outbox=True, max_attempts=3, ignore_result=True)
def outbox_failing(self: Any, fail_times: int) -> dict[str, Any]:
    return effect_failing(self, fail_times, lambda: RuntimeError("declined"))


@shared_task(base=IdempotentTask, bind=True, outbox=True, ignore_result=True)
def outbox_typed(self: Any, when: Any, amount: Any, ident: Any, pair: Any) -> dict[str, Any]:
    """Arguments whose types Celery's JSON serializer keeps: datetime, Decimal, UUID, a tuple."""
    return effect(self, [str(when), str(amount), str(ident), list(pair)])


@shared_task(base=IdempotentTask, bind=True, outbox=True, max_retries=5, max_attempts=10, ignore_result=True)
def outbox_retrying(self: Any, fail_times: int) -> dict[str, Any]:
    return effect_failing(self, fail_times, lambda: self.retry(countdown=0, exc=RuntimeError("try again")))
