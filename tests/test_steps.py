"""Checkpointed steps: a retry after partial success never repeats the part that finished."""

from __future__ import annotations

import os
import signal

import pytest

from django_idempotent_tasks.exceptions import LeaseLost
from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import SETTLE_TIMEOUT, Worker, body_pid, calls, finished, lapsed, leases_lost, wait_for
from tests.testapp import tasks
from tests.testapp.faults import arm, control
from tests.testapp.models import Effect


def charges(key: str) -> list[tuple[int, bool]]:
    return list(
        Effect.objects.filter(key=key, task=tasks.place_order.name)
        .order_by("pk")
        .values_list("fence", "recovered")
    )


@pytest.mark.django_db(transaction=True)
class TestInProcess:
    def test_a_step_runs_once_and_its_result_is_stored(self) -> None:
        with pytest.raises(ConnectionError):
            tasks.place_order.apply((1, 1), {"idempotency_key": "steps"}, throw=True, retries=3).get()
        record = IdempotencyRecord.objects.get()
        assert (record.status, list(record.steps)) == ("FAILED", ["charge"])
        result = tasks.place_order.apply((1, 1), {"idempotency_key": "steps"}).get()
        assert result == {
            "charge": {"value": "charge-1", "fence": 1},
            "notify": {"value": "notify-1", "fence": 2},
        }
        assert Effect.objects.count() == 2
        record.refresh_from_db()
        assert record.steps == result

    def test_eager_autoretry_reruns_only_what_did_not_finish(self) -> None:
        result = tasks.place_order.apply((2, 2), {"idempotency_key": "eager"}).get()
        assert result["charge"] == {"value": "charge-2", "fence": 1}
        assert list(Effect.objects.values_list("fence", flat=True)) == [1, 3]

    def test_a_step_result_that_cannot_be_stored_is_an_error_before_the_next_step(self) -> None:
        with pytest.raises(ValueError, match="Step 'bad' cannot be checkpointed. The result is not JSON"):
            tasks.unstorable_step.apply((), {"idempotency_key": "bad"}, throw=True).get()
        assert not Effect.objects.exists()  # the step after the bad one never ran
        assert IdempotencyRecord.objects.get().steps == {}

    def test_a_context_step_must_set_its_result_and_rolls_back_its_writes_on_error(self) -> None:
        with pytest.raises(RuntimeError, match="boom"):
            tasks.forgetful_step.apply((True,), {"idempotency_key": "a"}, throw=True).get()
        with pytest.raises(ValueError, match="finished without setting step.result"):
            tasks.forgetful_step.apply((False,), {"idempotency_key": "b"}, throw=True).get()
        assert not Effect.objects.exists()

    def test_a_stale_holder_cannot_checkpoint(self) -> None:
        with pytest.raises(LeaseLost):
            tasks.stale_step.apply((), {"idempotency_key": "stale"}, throw=True).get()
        assert IdempotencyRecord.objects.get().steps == {}


@pytest.mark.workers
class TestWorkers:
    def test_autoretry_after_partial_success_charges_once(self, running_workers: list[Worker]) -> None:
        tasks.place_order.delay(10, 2, idempotency_key="partial")
        done = finished("partial")
        assert done.attempts == 3
        assert charges("partial")[0] == (1, False)
        assert Effect.objects.filter(key="partial").count() == 2  # one charge, one notification

    def test_kill_after_the_checkpoint_skips_the_step(self, running_workers: list[Worker]) -> None:
        arm("after_charge_step", "after-checkpoint")
        tasks.place_order.delay(11, idempotency_key="after-checkpoint")
        done = finished("after-checkpoint")
        assert done.fence == 2
        values = list(Effect.objects.filter(key="after-checkpoint").values_list("fence", flat=True))
        assert values == [1, 2]  # the charge under fence 1, the notification under fence 2

    def test_kill_inside_a_step_reruns_it_as_recovered(self, running_workers: list[Worker]) -> None:
        arm("after_effect", "inside-step")
        tasks.place_order.delay(12, idempotency_key="inside-step")
        done = finished("inside-step")
        rows = list(Effect.objects.filter(key="inside-step").order_by("pk").values_list("fence", "recovered"))
        assert rows == [(2, True), (2, True)]  # the killed step's write rolled back with it
        assert calls("inside-step") == 3  # charge twice (external), notify once
        assert done.steps["charge"] == {"value": "charge-12", "fence": 2}

    @pytest.mark.row_locks
    def test_a_paused_holder_cannot_checkpoint_after_a_takeover(self, running_workers: list[Worker]) -> None:
        tasks.slow_step.delay(4, idempotency_key="paused-step")
        pid = body_pid("paused-step")
        os.kill(pid, signal.SIGSTOP)
        try:
            lapsed(tasks.slow_step.name, "paused-step")
            control().delete("pid:paused-step")
            tasks.slow_step.delay(4, idempotency_key="paused-step")
            done = finished("paused-step")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(
            lambda: 1 in leases_lost("paused-step"),
            timeout=SETTLE_TIMEOUT,
            what="the paused holder to be refused",
        )
        assert done.steps == {"slow": {"value": "slow", "fence": 2}}
