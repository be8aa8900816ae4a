"""``@idempotent`` on plain functions: the guarantee of IdempotentTask without Celery."""

from __future__ import annotations

import io
import multiprocessing
import re
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from django_idempotent_tasks import signals
from django_idempotent_tasks.decorators import idempotent
from django_idempotent_tasks.exceptions import (
    AttemptsExhausted,
    IdempotencyConfigurationError,
    IdempotencyKeyMismatch,
    InvalidIdempotencyKey,
    LeaseLost,
    MissingIdempotencyKey,
    TaskInProgress,
    UnstorableResult,
)
from django_idempotent_tasks.idempotency import current
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.tasks import IdempotentTask
from tests.celery_app import app as celery_app
from tests.helpers import ROOT, calls
from tests.testapp import functions, spawned
from tests.testapp.faults import arm
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)
PROCESS_TIMEOUT = 60  # seconds a spawned process may take, Django set-up included


@pytest.fixture
def received() -> Iterator[list[str]]:
    """The names of the app's signals sent during the test, in order."""
    seen: list[str] = []
    names = ["task_claimed", "task_completed", "task_replayed", "task_failed", "lock_conflict", "lease_lost"]
    handlers = {name: (lambda sender, name=name, **kw: seen.append(name)) for name in names}
    for name, handler in handlers.items():
        getattr(signals, name).connect(handler)
    yield seen
    for name, handler in handlers.items():
        getattr(signals, name).disconnect(handler)


def test_a_call_inside_the_callers_transaction_keeps_its_lease_past_its_length(received: list[str]) -> None:
    # ATOMIC_REQUESTS, or an idempotent call inside an atomic body: the claim is not committed, so
    # the heartbeat's connection cannot renew it, and no other delivery can take it over either.
    with transaction.atomic():
        lost = functions.outlives_its_lease(3, idempotency_key="in-a-transaction")
    assert (lost, received.count("lease_lost")) == (False, 0)
    assert IdempotencyRecord.objects.get(key="in-a-transaction").status == "SUCCEEDED"


def test_a_second_call_replays_the_stored_result_without_the_body(received: list[str]) -> None:
    first = functions.charge(42, 1000)
    assert functions.charge(42, 1000) == first == {"value": 1000, "fence": 1, "recovered": False}
    assert functions.charge(order_id=42, amount_cents=1000) == first
    assert Effect.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert (record.key, record.status) == ("order-charge-42", "SUCCEEDED")
    assert record.task_name == record.scope == "tests.testapp.functions.charge"
    assert received == ["task_claimed", "task_completed", "task_replayed", "task_replayed"]


def test_the_callers_key_wins_and_reaches_a_body_that_takes_it() -> None:
    functions.charge(42, 1000, idempotency_key="explicit")
    assert IdempotencyRecord.objects.get().key == "explicit"
    assert functions.charge_callable(7) == {"value": 7, "fence": 1, "recovered": False}
    assert IdempotencyRecord.objects.filter(key="callable-7").exists()
    assert functions.takes_key(1, idempotency_key="k") == "1:k"


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: functions.record(1), MissingIdempotencyKey, "needs an idempotency key"),
        (lambda: functions.record(1, idempotency_key=" "), InvalidIdempotencyKey, "empty"),
        (lambda: functions.record(1, idempotency_key=5), InvalidIdempotencyKey, "must be a str"),
        (lambda: functions.record(1, idempotency_key="x" * 256), InvalidIdempotencyKey, "255"),
        (lambda: functions.record(1, idempotency_key="a\x00b"), InvalidIdempotencyKey, "control"),
        (lambda: functions.record(1, 2, 3, idempotency_key="k"), TypeError, "do not fit"),
        (lambda: functions.record(object(), idempotency_key="k"), TypeError, "not JSON serializable"),
    ],
)
def test_bad_calls_fail_in_the_caller_and_store_nothing(call: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()
    assert not IdempotencyRecord.objects.exists()
    assert not Effect.objects.exists()


def test_same_key_other_arguments_is_a_mismatch_and_changes_nothing() -> None:
    functions.record(1, idempotency_key="same")
    with pytest.raises(IdempotencyKeyMismatch, match="different arguments"):
        functions.record(2, idempotency_key="same")
    assert Effect.objects.count() == 1
    assert IdempotencyRecord.objects.get().result == {"value": 1, "fence": 1, "recovered": False}


def test_failures_are_recorded_and_exhaust_max_attempts(received: list[str]) -> None:
    for attempt in (1, 2):
        with pytest.raises(ValueError, match=f"failure {attempt}"):
            functions.failing(0, idempotency_key="fails")
    with pytest.raises(AttemptsExhausted, match="max_attempts=2"):
        functions.failing(0, idempotency_key="fails")
    assert Effect.objects.count() == 2
    assert IdempotencyRecord.objects.get().status == "FAILED"
    assert received.count("task_failed") == 2


def test_an_unstorable_result_still_marks_the_key_done_and_the_caller_hears_of_it() -> None:
    # As an eager task's call does (docs/reference/options.md): the key is done, the value is lost.
    with pytest.raises(UnstorableResult, match="is done and will not run again"):
        functions.unstorable(1, idempotency_key="u")
    assert functions.unstorable(1, idempotency_key="u") is None  # the replay of the stored null
    assert Effect.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert (record.status, (record.error or {})["type"]) == ("SUCCEEDED", "UnstorableResult")


def test_an_atomic_body_rolls_back_its_writes_when_it_fails() -> None:
    with pytest.raises(RuntimeError, match="failed after its write"):
        functions.atomic_record(1, fail=True, idempotency_key="atomic")
    assert Effect.objects.count() == 0
    assert IdempotencyRecord.objects.get().status == "FAILED"
    assert functions.atomic_record(1, idempotency_key="other") == {"value": 1, "fence": 1, "recovered": False}
    assert Effect.objects.count() == 1


def test_an_atomic_body_rolls_back_when_its_fence_moved(received: list[str]) -> None:
    @idempotent(atomic=True, on_conflict="raise")
    def taken_over_while_running() -> None:
        functions.effect("taken_over", 1)
        IdempotencyRecord.objects.update(fence=F("fence") + 1)  # another caller takes the key over

    with pytest.raises(LeaseLost, match=r"lost its lease \(fence 1\)"):
        taken_over_while_running(idempotency_key="fenced")
    assert Effect.objects.count() == 0  # the body's write rolled back with the refused completion
    assert "lease_lost" in received


def test_steps_run_once_across_attempts() -> None:
    with pytest.raises(RuntimeError, match="shipping failed"):
        functions.stepped(5, fail_after_charge=True, idempotency_key="steps")
    assert functions.stepped(5, fail_after_charge=True, idempotency_key="steps") == {
        "charged": 5,
        "ship": {"shipped": 5},
        "attempt": 2,
    }
    assert Effect.objects.count() == 1  # the charge step did not run again
    assert set(IdempotencyRecord.objects.get().steps) == {"charge", "ship"}


def test_current_is_the_running_celery_tasks_idempotency_too() -> None:
    def probe(self: Any) -> bool:
        return current() is self.idempotency

    # Registered on the test app for this test only: the system checks list every idempotent task.
    celery_task = celery_app.task(base=IdempotentTask, bind=True, shared=False, name="tests.current_probe")(
        probe
    )
    try:
        assert celery_task.apply(kwargs={"idempotency_key": "celery"}).get() is True
    finally:
        celery_app.tasks.unregister("tests.current_probe")


def test_current_is_only_available_inside_a_body() -> None:
    with pytest.raises(RuntimeError, match="only available inside the body"):
        current()
    functions.record(1, idempotency_key="ctx")
    with pytest.raises(RuntimeError, match="only available inside the body"):
        current()


def stale_record(function: Any, key: str, args: tuple[Any, ...], lease: timedelta) -> IdempotencyRecord:
    """An IN_PROGRESS record as a crashed (or still running) holder leaves it."""
    spec = function.idempotent
    now = timezone.now()
    return IdempotencyRecord.objects.create(
        scope=spec.scope,
        key=key,
        task_name=spec.name,
        fingerprint=spec.prepare(args, {"idempotency_key": key}).fingerprint,
        worker="gone:1",
        started_at=now - timedelta(minutes=5),
        lease_expires_at=now + lease,
        expires_at=now + timedelta(days=1),
    )


def test_a_live_lease_raises_task_in_progress_when_asked_to(received: list[str]) -> None:
    stale_record(functions.raising_conflict, "busy", (0,), timedelta(seconds=30))
    with pytest.raises(TaskInProgress, match="being executed by another delivery"):
        functions.raising_conflict(0, idempotency_key="busy")
    assert received == ["lock_conflict"]


def test_a_caller_waits_for_an_expired_lease_then_takes_over_as_recovered() -> None:
    stale_record(functions.record, "stale", (3,), timedelta(seconds=1))
    assert functions.record(3, idempotency_key="stale") == {"value": 3, "fence": 2, "recovered": True}


def test_64_threads_calling_one_key_run_the_body_once(connection_crowd: None) -> None:
    answers: list[Any] = []
    barrier = threading.Barrier(64)

    def call() -> None:
        barrier.wait()
        try:
            answers.append(functions.record(9, 0.3, idempotency_key="threads"))
        finally:
            connection.close()

    threads = [threading.Thread(target=call) for _ in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert answers == [{"value": 9, "fence": 1, "recovered": False}] * 64
    assert Effect.objects.count() == 1


def spawn(worker_env: dict[str, str], name: str, *args: Any, **kwargs: Any) -> Any:
    """A real process (spawned: no inherited connections) calling one function of the test app."""
    process = multiprocessing.get_context("spawn").Process(
        target=spawned.call, args=(worker_env, name, list(args), kwargs)
    )
    process.start()
    return process


def test_two_processes_calling_one_key_run_the_body_once(worker_env: dict[str, str]) -> None:
    connections.close_all()
    processes = [spawn(worker_env, "record", 4, 1.0, idempotency_key="procs") for _ in range(2)]
    for process in processes:
        process.join(PROCESS_TIMEOUT)
    assert [process.exitcode for process in processes] == [0, 0]
    assert Effect.objects.get().pid in {process.pid for process in processes}
    assert IdempotencyRecord.objects.get().status == "SUCCEEDED"


@pytest.mark.parametrize(
    ("name", "effects"),
    [
        ("short_lease", [(1, False), (2, True)]),  # the dead caller's write was committed
        ("short_lease_atomic", [(2, True)]),  # the dead caller's write rolled back
    ],
)
def test_a_caller_killed_mid_body_is_taken_over_after_its_lease(
    worker_env: dict[str, str], name: str, effects: list[tuple[int, bool]]
) -> None:
    arm("after_effect", "killed")
    connections.close_all()
    first = spawn(worker_env, name, 5, idempotency_key="killed")
    first.join(PROCESS_TIMEOUT)
    assert first.exitcode == -9  # SIGKILLed by its kill point, after the effect
    assert IdempotencyRecord.objects.get().status == "IN_PROGRESS"
    # The second caller finds a live lease, waits for it to expire (lock_ttl=2) and takes over.
    function = getattr(functions, name)
    assert function(5, idempotency_key="killed") == {"value": 5, "fence": 2, "recovered": True}
    assert function(5, idempotency_key="killed")["fence"] == 2
    assert [(e.fence, e.recovered) for e in Effect.objects.order_by("pk")] == effects
    assert calls("killed") == 2  # the external call happened twice
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.fence, record.attempts) == ("SUCCEEDED", 2, 2)


def test_a_lost_lease_is_reported_to_the_body_at_its_next_step() -> None:
    @idempotent(on_conflict="raise")
    def loses_its_lease() -> None:
        IdempotencyRecord.objects.update(fence=F("fence") + 1)
        current().step("after", lambda: 1)

    with pytest.raises(LeaseLost, match="lost its lease"):
        loses_its_lease(idempotency_key="lost")
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.steps) == ("IN_PROGRESS", {})


async def _coroutine() -> None:
    """An async function, which @idempotent refuses."""


def _two(a: int, b: int) -> int:
    return a + b


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"lock_ttl": 0}, "lock_ttl must be a positive int"),
        ({"record_ttl": -1}, "record_ttl must be a positive int"),
        ({"max_attempts": True}, "max_attempts must be a positive int"),
        ({"lock_ttl": "60"}, "lock_ttl must be a positive int"),
        ({"atomic": 1}, "atomic must be True or False"),
        ({"on_conflict": "retry"}, "no broker to re-queue to"),
        ({"scope": ""}, "scope must be a non-empty str"),
        ({"key": 5}, "key must be a str.format template, a callable or None"),
        ({"key": "order-{order_id}"}, "uses {order_id}, which is not a parameter"),
        ({"key": "order-{0}"}, "which is not a parameter"),
        ({"key": "order-{a"}, "bad key template"),
    ],
)
def test_bad_options_are_refused_when_decorating(options: dict[str, Any], match: str) -> None:
    with pytest.raises(IdempotencyConfigurationError, match=match):
        idempotent(**options)(_two)


def test_async_functions_are_refused_with_a_way_out() -> None:
    with pytest.raises(IdempotencyConfigurationError, match="sync_to_async"):
        idempotent(_coroutine)


def test_only_functions_can_be_decorated() -> None:
    with pytest.raises(IdempotencyConfigurationError, match="decorates a function"):
        idempotent(42)  # type: ignore[call-overload]


def test_a_function_whose_dotted_path_overflows_the_records_column_is_refused() -> None:
    def body() -> None: ...

    body.__qualname__ = "deeply." * 40 + "body"  # the record's task_name holds 255 characters
    with pytest.raises(IdempotencyConfigurationError, match=r"tests\.test_decorators\.deeply.* over 255"):
        idempotent(body)


def test_the_docs_example_runs() -> None:
    page = (ROOT / "docs" / "howto" / "functions.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.DOTALL)
    assert code is not None
    exec(code[1], {"__name__": "readme"})
    records = IdempotencyRecord.objects.filter(task_name="readme.charge").order_by("key")
    assert [(r.key, r.status) for r in records] == [
        ("explicit", "SUCCEEDED"),
        ("order-charge-42", "SUCCEEDED"),
    ]
    assert str((records[1].result or {})["provider_key"]).startswith("idem-")


def test_the_commands_and_the_admin_cover_function_records(admin_client: Any) -> None:
    functions.charge(42, 1000)
    out = io.StringIO()
    call_command("idempotency_status", stdout=out)
    assert "tests.testapp.functions.charge: 1 " in out.getvalue()
    page = admin_client.get(reverse("admin:django_idempotent_tasks_idempotencyrecord_changelist"))
    assert "order-charge-42" in page.content.decode()
    functions.record(1, idempotency_key="kept")
    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    call_command(
        "purge_idempotency_records", "--task", "tests.testapp.functions.charge", stdout=io.StringIO()
    )
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["kept"]


def _charge_v1(order_id: int) -> dict[str, Any]:
    return effect_of("v1", order_id)


def _charge_v2(order_id: int, currency: str = "EUR") -> dict[str, Any]:
    return effect_of("v2", order_id)


def effect_of(release: str, order_id: int) -> dict[str, Any]:
    Effect.objects.create(key=current().key, task=release, pid=0)
    return {"release": release, "order_id": order_id}


def test_a_redeploy_adding_a_defaulted_parameter_keeps_the_fingerprint() -> None:
    # One scope for both releases: the same function, before and after the deploy.
    before = idempotent(scope="deploy.charge")(_charge_v1)
    after = idempotent(scope="deploy.charge")(_charge_v2)
    assert before(7, idempotency_key="deploy-7") == {"release": "v1", "order_id": 7}
    assert after(7, idempotency_key="deploy-7") == {"release": "v1", "order_id": 7}  # a replay
    assert after(7, currency="EUR", idempotency_key="deploy-7") == {"release": "v1", "order_id": 7}
    assert list(Effect.objects.values_list("task", flat=True)) == ["v1"]
    with pytest.raises(IdempotencyKeyMismatch):
        after(7, currency="USD", idempotency_key="deploy-7")
