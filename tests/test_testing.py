"""``django_idempotent_tasks.testing`` and the pytest plugin, used as a user's test suite would."""

from __future__ import annotations

import importlib.metadata
import threading
from typing import Any

import pytest
from django.test import TransactionTestCase

from django_idempotent_tasks import signals
from django_idempotent_tasks.exceptions import MissingIdempotencyKey
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.testing import assert_runs_once, count_executions
from tests.helpers import wait_for
from tests.testapp import functions, tasks
from tests.testapp.models import Effect


@pytest.mark.django_db(transaction=True)
def test_count_executions_counts_bodies_not_replays() -> None:
    with count_executions(tasks.record_effect) as runs:
        tasks.record_effect.apply(args=(1,), kwargs={"idempotency_key": "once"})
        tasks.record_effect.apply(args=(1,), kwargs={"idempotency_key": "once"})
        tasks.record_effect.apply(args=(2,), kwargs={"idempotency_key": "twice"})
    assert runs.count == len(runs) == 2
    assert [(run.key, run.fence, run.attempt, run.recovered) for run in runs.runs] == [
        ("once", 1, 1, False),
        ("twice", 1, 1, False),
    ]
    assert [run.scope for run in runs.for_key("once")] == [tasks.record_effect.name]
    assert "record_effect: 2" in repr(runs)


@pytest.mark.django_db(transaction=True)
def test_count_executions_sees_only_its_task_and_only_inside_the_block() -> None:
    with count_executions(tasks.record_effect) as runs:
        tasks.atomic_effect.apply(args=(1,), kwargs={"idempotency_key": "other-task"})
    tasks.record_effect.apply(args=(1,), kwargs={"idempotency_key": "after-the-block"})
    assert runs.count == 0
    assert Effect.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_count_executions_counts_a_retry_after_a_failure() -> None:
    with count_executions(tasks.failing) as runs:
        tasks.failing.apply(args=(1,), kwargs={"idempotency_key": "flaky"})
        tasks.failing.apply(args=(1,), kwargs={"idempotency_key": "flaky"})
    assert [run.attempt for run in runs.for_key("flaky")] == [1, 2]


def test_count_executions_rejects_what_is_not_a_task() -> None:
    with pytest.raises(TypeError, match="Expected a Celery task"), count_executions(object()):
        pass


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_with_concurrent_threads() -> None:
    results = assert_runs_once(tasks.concurrent_effect, 5, sleep=0.3, key="burst", times=12)
    assert results == [{"value": 5, "fence": 1}] * 12
    assert Effect.objects.filter(key="burst").count() == 1


@pytest.mark.django_db
def test_assert_runs_once_sequentially_inside_a_test_transaction() -> None:
    results = assert_runs_once(tasks.record_effect, 3, key="double-call", times=2, threads=False)
    assert results == [{"value": 3, "fence": 1}] * 2
    assert Effect.objects.filter(key="double-call").count() == 1


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_accepts_task_in_progress_when_on_conflict_is_raise() -> None:
    results = assert_runs_once(tasks.raising_conflict, 0.5, key="raising", times=6)
    assert 1 <= len(results) <= 6
    assert all(result == {"value": 0.5, "fence": 1} for result in results)
    assert Effect.objects.filter(key="raising").count() == 1


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_fails_when_the_body_runs_twice() -> None:
    # The first delivery fails, so the second one runs the body again: not "once".
    with pytest.raises(AssertionError, match=r"ran 2 times under key 'flaky' in 2 deliveries") as info:
        assert_runs_once(tasks.failing, 1, key="flaky", times=2, threads=False)
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_fails_when_the_key_was_used_before() -> None:
    tasks.record_effect.apply(args=(1,), kwargs={"idempotency_key": "used"})
    with pytest.raises(AssertionError, match="ran 0 times.*Was the key used before"):
        assert_runs_once(tasks.record_effect, 1, key="used", times=3)


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_fails_when_the_deliveries_answer_differently() -> None:
    # Something rewrote the stored result after the first delivery: its replays answer otherwise.
    def rewrite(sender: Any, key: str, **kwargs: Any) -> None:
        IdempotencyRecord.objects.filter(key=key).update(result={"value": "rewritten"})

    signals.task_completed.connect(rewrite, sender=tasks.record_effect)
    try:
        with pytest.raises(AssertionError, match="under key 'rewritten' returned different results"):
            assert_runs_once(tasks.record_effect, 1, key="rewritten", times=2, threads=False)
    finally:
        signals.task_completed.disconnect(rewrite, sender=tasks.record_effect)
    assert Effect.objects.filter(key="rewritten").count() == 1


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_fails_when_the_deliveries_outlast_the_timeout() -> None:
    with pytest.raises(
        AssertionError, match=r"2 deliveries of .*concurrent_effect did not all finish within 0.2 s"
    ):
        assert_runs_once(tasks.concurrent_effect, 1, sleep=2, key="slow", times=2, timeout=0.2)
    wait_for(
        lambda: not any(thread.name.startswith("assert-runs-once-") for thread in threading.enumerate()),
        what="the deliveries to finish",
    )
    assert IdempotencyRecord.objects.get(key="slow").status == "SUCCEEDED"


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_fails_when_a_delivery_raises() -> None:
    # The body runs once and fails; the next deliveries get AttemptsExhausted. Once, but not a pass.
    with pytest.raises(AssertionError, match=r"3 of 3 deliveries .* raised") as info:
        assert_runs_once(tasks.fails_for_good, 1, key="for-good", times=3, threads=False)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert Effect.objects.filter(key="for-good").count() == 1


@pytest.mark.django_db
def test_assert_runs_once_refuses_threads_inside_a_test_transaction() -> None:
    with pytest.raises(RuntimeError, match="TransactionTestCase"):
        assert_runs_once(tasks.record_effect, 1, key="k")
    assert not IdempotencyRecord.objects.exists()


def test_assert_runs_once_needs_one_delivery_at_least() -> None:
    with pytest.raises(ValueError, match="times must be at least 1"):
        assert_runs_once(tasks.record_effect, 1, key="k", times=0)


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_reports_a_missing_key_as_an_error() -> None:
    with pytest.raises(AssertionError, match="ran 0 times") as info:
        assert_runs_once(tasks.record_effect, 1, key=None, times=2, threads=False)  # type: ignore[arg-type]
    assert isinstance(info.value.__cause__, MissingIdempotencyKey)


def test_the_plugin_is_registered_through_its_entry_point() -> None:
    plugins = importlib.metadata.entry_points(group="pytest11")
    assert {ep.value for ep in plugins if ep.name == "django_idempotent_tasks"} == {
        "django_idempotent_tasks.pytest_plugin"
    }


@pytest.mark.django_db(transaction=True)
def test_plugin_fixtures(count_executions: Any, idempotency_records: Any) -> None:
    with count_executions(tasks.charge_order) as runs:
        tasks.charge_order.apply(args=(42,))
        tasks.charge_order.apply(args=(42,))
    assert runs.count == 1
    assert idempotency_records.get(key="order-42").status == IdempotencyRecord.Status.SUCCEEDED


class UnittestStyle(TransactionTestCase):
    """The helpers from a plain ``unittest``-style Django test case."""

    def test_double_call(self) -> None:
        with count_executions(tasks.record_effect) as runs:
            first = tasks.record_effect.apply(args=(9,), kwargs={"idempotency_key": "unittest"}).get()
            second = tasks.record_effect.apply(args=(9,), kwargs={"idempotency_key": "unittest"}).get()
        self.assertEqual(first, second)
        self.assertEqual(runs.count, 1)

    def test_concurrent(self) -> None:
        assert_runs_once(tasks.concurrent_effect, 6, sleep=0.2, key="unittest-burst", times=8)
        self.assertEqual(Effect.objects.filter(key="unittest-burst").count(), 1)


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_on_an_idempotent_function() -> None:
    results = assert_runs_once(functions.record, 5, sleep=0.2, key="function-burst", times=4)
    assert [result["value"] for result in results] == [5] * 4
    assert Effect.objects.filter(key="function-burst").count() == 1


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_on_a_function_that_raises_on_conflict() -> None:
    results = assert_runs_once(functions.raising_conflict, 1, key="function-raise", times=3, threads=False)
    assert len(results) == 3


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_on_a_django_task() -> None:
    results = assert_runs_once(functions.db_receipt, 8, key="task-burst", times=3, threads=False)
    assert [result["value"] for result in results] == [8] * 3
    assert Effect.objects.filter(key="task-burst").count() == 1


@pytest.mark.django_db(transaction=True)
def test_count_executions_counts_a_function_and_a_django_task() -> None:
    with count_executions(functions.record) as runs, count_executions(functions.send_receipt) as receipts:
        functions.record(1, idempotency_key="counted")
        functions.record(1, idempotency_key="counted")
        functions.send_receipt.func(3)
        functions.send_receipt.func(3)
        functions.send_receipt_inner.func(4, idempotency_key="inner")
    assert [run.key for run in runs.runs] == ["counted"]
    assert [run.key for run in receipts.runs] == ["receipt-3"]
    assert runs.task_name == "tests.testapp.functions.record"


@pytest.mark.django_db(transaction=True)
def test_the_plugin_fixture_counts_a_function(idempotent_tasks_count_executions: Any) -> None:
    with idempotent_tasks_count_executions(functions.record) as runs:
        functions.record(2, idempotency_key="fixture-counted")
    assert runs.count == 1
