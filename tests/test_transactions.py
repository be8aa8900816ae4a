"""Steps and claims inside transactions, lease loss told to the body, fenced exhaustion."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from django_idempotent_tasks import store, values
from django_idempotent_tasks.exceptions import LeaseLost
from django_idempotent_tasks.models import DatabaseNow, IdempotencyRecord
from tests.helpers import calls
from tests.running import run_task as run
from tests.testapp import tasks
from tests.testapp.faults import control
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("task", [tasks.atomic_step, tasks.step_in_own_transaction])
def test_a_step_refuses_to_run_inside_a_transaction(task: Any) -> None:
    with pytest.raises(RuntimeError, match="Step 'pay' cannot run inside an open database transaction"):
        run(task, key="in-tx")
    assert calls("in-tx") == 0  # refused before its function ran


def test_a_step_refuses_to_run_in_an_eager_call_inside_the_callers_transaction() -> None:
    with (
        pytest.raises(RuntimeError, match="cannot run inside an open database transaction"),
        transaction.atomic(),
    ):
        run(tasks.place_order, 1, key="caller-tx")
    assert Effect.objects.count() == 0


@contextmanager
def autocommit_off() -> Iterator[None]:
    """A transaction opened the old way, by turning autocommit off: no atomic block."""
    transaction.set_autocommit(False)
    try:
        yield
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)


def test_a_step_refuses_to_run_with_autocommit_turned_off() -> None:
    with (
        autocommit_off(),
        pytest.raises(RuntimeError, match="cannot run inside an open database transaction"),
    ):
        run(tasks.place_order, 2, key="no-autocommit")
    assert calls("no-autocommit") == 0


def test_a_lost_insert_race_leaves_a_transaction_opened_by_set_autocommit_usable() -> None:
    claim = {"task_name": "t", "fingerprint": "f", "task_id": "t", "worker": "w"}
    with autocommit_off():
        assert store.insert("s", "raced", lease_seconds=60, record_ttl=60, **claim) is not None
        assert store.insert("s", "raced", lease_seconds=60, record_ttl=60, **claim) is None
        # The losing INSERT was isolated in a savepoint: the transaction still answers.
        assert IdempotencyRecord.objects.filter(key="raced").count() == 1


def test_an_eager_call_inside_a_callers_transaction_rolls_back_with_it() -> None:
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        assert run(tasks.record_effect, 1, key="rolled-back") == {"value": 1, "fence": 1}
        assert IdempotencyRecord.objects.get(key="rolled-back").status == "SUCCEEDED"
        1 / 0  # noqa: B018
    # The claim and the completion were part of the caller's transaction: both are gone with it.
    assert not IdempotencyRecord.objects.filter(key="rolled-back").exists()
    assert not Effect.objects.exists()
    assert run(tasks.record_effect, 1, key="rolled-back") == {"value": 1, "fence": 1}
    assert Effect.objects.count() == 1


def test_a_lost_lease_is_told_to_the_body_before_its_next_step() -> None:
    with pytest.raises(LeaseLost, match="lost its lease"):
        run(tasks.notices_lost_lease, key="lost")
    assert control().get("lost:lost") == b"1"
    assert calls("lost") == 0


def expired_record(**fields: Any) -> IdempotencyRecord:
    past = timezone.now() - timedelta(seconds=60)
    values: dict[str, Any] = {
        "scope": "s",
        "key": "k",
        "task_name": "t",
        "fingerprint": "f",
        "lease_expires_at": past,
    }
    return IdempotencyRecord.objects.create(**{**values, **fields})


def test_a_take_over_reads_the_steps_fresh_under_its_claim() -> None:
    stale = expired_record(steps={})
    IdempotencyRecord.objects.filter(pk=stale.pk).update(steps={"charge": 1})  # checkpointed after our read
    claim = store.take_over(stale, task_id="t2", worker="w", lease_seconds=60, record_ttl=60)
    assert claim is not None and claim.recovered
    assert claim.record.steps == {"charge": 1}


def test_exhaust_spares_a_live_holder_and_a_moved_fence() -> None:
    live = expired_record(attempts=5, lease_expires_at=timezone.now() + timedelta(seconds=60))
    assert not store.exhaust(live, max_attempts=5)
    stale = IdempotencyRecord.objects.get(pk=live.pk)
    IdempotencyRecord.objects.filter(pk=live.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1), fence=2
    )
    assert not store.exhaust(stale, max_attempts=5)
    assert IdempotencyRecord.objects.get(pk=live.pk).status == "IN_PROGRESS"
    assert store.exhaust(IdempotencyRecord.objects.get(pk=live.pk), max_attempts=5)
    assert (IdempotencyRecord.objects.get(pk=live.pk).error or {})["type"] == "AttemptsExhausted"


def test_leases_are_judged_on_the_database_clock() -> None:
    # A lease 30 s in the future of the database clock is live, whatever this process's clock says.
    record = expired_record()
    IdempotencyRecord.objects.filter(pk=record.pk).update(lease_expires_at=DatabaseNow(30))
    assert list(IdempotencyRecord.objects.live()) == [record]
    assert not IdempotencyRecord.objects.stuck().exists()
    assert not IdempotencyRecord.objects.claimable().exists()


def test_a_hard_time_limit_frees_only_the_killed_childs_claim() -> None:
    # The message came back with the same task id and another child took the key over.
    redelivered = expired_record(
        task_id="t", worker="host:2", lease_expires_at=timezone.now() + timedelta(seconds=60)
    )
    error = values.error_shape("TimeLimitExceeded", "TimeLimitExceeded(2)")
    assert not store.fail_task("s", "k", "t", error, worker="host:1")
    assert IdempotencyRecord.objects.get(pk=redelivered.pk).status == "IN_PROGRESS"
    assert store.fail_task("s", "k", "t", error, worker="host:2")
    assert IdempotencyRecord.objects.get(pk=redelivered.pk).status == "FAILED"
