"""The record remembers its attempts: each claim and how it ended, written by the claim and end
statements themselves on the database clock."""

from __future__ import annotations

from typing import Any

import pytest

from django_idempotent_tasks import history, store
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.values import error_shape
from tests.helpers import Worker, finished
from tests.testapp import tasks
from tests.testapp.faults import arm
from tests.testapp.models import Effect

LEASE = {"lease_seconds": 60, "record_ttl": 60}


def _insert(key: str = "k") -> store.Claim:
    claim = store.insert(
        "s", key, task_name="tests.task", fingerprint="f" * 64, task_id="t1", worker="host:1", **LEASE
    )
    assert claim is not None
    return claim


def _log(key: str = "k") -> list[dict[str, Any]]:
    log: list[dict[str, Any]] = IdempotencyRecord.objects.get(key=key).attempts_log
    return log


def _expire(key: str = "k") -> None:
    IdempotencyRecord.objects.filter(key=key).update(lease_expires_at="2020-01-01T00:00:00Z")


def test_a_first_claim_and_its_completion_are_logged(db: Any) -> None:
    claim = _insert()
    assert store.complete(claim, {"ok": 1}, None, 60)

    claimed, completed = _log()
    assert {k: v for k, v in claimed.items() if k != "at"} == {
        "event": "claimed",
        "fence": 1,
        "attempt": 1,
        "worker": "host:1",
        "task_id": "t1",
    }
    assert {k: v for k, v in completed.items() if k != "at"} == {"event": "completed", "fence": 1}
    (attempt,) = history.attempts(_log())
    assert (attempt.number, attempt.worker, attempt.task_id, attempt.ending) == (
        1,
        "host:1",
        "t1",
        "completed",
    )
    assert attempt.claimed_at is not None and attempt.ended_at is not None
    assert attempt.ended_at >= attempt.claimed_at


def test_a_take_over_ends_the_dead_holders_attempt(db: Any) -> None:
    _insert()
    _expire()
    snapshot = store.lookup("s", "k")
    assert snapshot is not None
    claim = store.take_over(snapshot, task_id="t2", worker="host:2", **LEASE)
    assert claim is not None and claim.recovered
    assert store.complete(claim, 1, None, 60)

    first, second = history.attempts(_log())
    assert (first.number, first.worker, first.ending) == (1, "host:1", "taken_over")
    assert (second.number, second.worker, second.task_id, second.ending) == (2, "host:2", "t2", "completed")
    assert history.summary(_log()).startswith("attempt 1 on host:1 died mid-body and was taken over ")
    assert "; attempt 2 on host:2 recovered and completed after " in history.summary(_log())


def test_a_failure_a_kill_and_a_release_end_their_attempts(db: Any) -> None:
    claim = _insert()
    assert store.fail(claim, error_shape("ValueError", "boom"))
    snapshot = store.lookup("s", "k")
    assert snapshot is not None
    second = store.take_over(snapshot, task_id="t2", worker="host:2", **LEASE)
    assert second is not None and not second.recovered
    assert store.fail_task("s", "k", "t2", error_shape("TimeLimitExceeded", "2"))
    snapshot = store.lookup("s", "k")
    assert snapshot is not None
    assert store.take_over(snapshot, task_id="t3", worker="host:3", **LEASE) is not None
    _expire()
    assert store.release_lease(IdempotencyRecord.objects.get(key="k"), by="alice")

    endings = [(a.number, a.ending, a.detail) for a in history.attempts(_log())]
    assert endings == [
        (1, "failed", "ValueError"),
        (2, "died", "TimeLimitExceeded"),
        (3, "released", "by alice"),
    ]


def test_a_holder_that_hears_of_its_lost_lease_is_logged_as_lost(db: Any) -> None:
    old = _insert()
    _expire()
    snapshot = store.lookup("s", "k")
    assert snapshot is not None
    assert store.take_over(snapshot, task_id="t2", worker="host:2", **LEASE) is not None
    assert not store.complete(old, 1, None, 60)
    store.note_lease_lost(old)

    first, second = history.attempts(_log())
    assert (first.ending, second.ending) == ("lease_lost", None)
    assert history.summary(_log()) == (
        f"attempt 1 on host:1 lost its lease after {first.seconds:.1f} s; "
        "attempt 2 on host:2 recovered and is running"
    )


def test_the_log_is_bounded(db: Any) -> None:
    claim = _insert()
    for n in range(history.MAX_EVENTS + 5):
        assert store.fail(claim, error_shape("E", str(n)))
        snapshot = store.lookup("s", "k")
        assert snapshot is not None
        taken = store.take_over(snapshot, task_id=f"t{n}", worker="host:1", **LEASE)
        assert taken is not None
        claim = taken
    log = _log()
    assert len(log) == history.MAX_EVENTS
    assert log[-1] == {**log[-1], "event": "claimed", "fence": claim.fence}
    assert log[-2] == {**log[-2], "event": "failed", "fence": claim.fence - 1}


def test_an_eager_delivery_logs_its_attempt(db: Any) -> None:
    tasks.record_effect.apply(args=(1,), kwargs={"idempotency_key": "eager"})
    (attempt,) = history.attempts(_log("eager"))
    assert attempt.ending == "completed" and attempt.task_id


@pytest.mark.workers
def test_a_sigkill_mid_body_shows_in_the_history(running_workers: list[Worker]) -> None:
    arm("after_effect", "hist")
    tasks.short_lease.delay(1, idempotency_key="hist")
    done = finished("hist")

    assert list(Effect.objects.filter(key="hist").order_by("pk").values_list("fence", "recovered")) == [
        (1, False),
        (2, True),
    ]
    first, second = history.attempts(done.attempts_log)
    killed = Effect.objects.get(key="hist", fence=1)
    assert (first.number, first.ending) == (1, "taken_over")
    assert first.worker.endswith(f":{killed.pid}")
    assert (second.number, second.ending, second.task_id) == (2, "completed", done.task_id)
    assert "; attempt 2 on " in history.summary(done.attempts_log)
    assert " recovered and completed after " in history.summary(done.attempts_log)


def test_a_history_is_read_whatever_it_holds() -> None:
    claimed = {"event": "claimed", "fence": 3, "attempt": 3, "worker": "h:1", "task_id": "t", "at": None}
    log = [
        "not an event",
        {"event": "completed", "fence": 2, "at": "2026-12-03T07:54:09Z"},  # its claim was dropped
        claimed,
        {"event": "renamed", "fence": 3},  # an event a later version may write
    ]
    (attempt,) = history.attempts(log)
    assert (attempt.number, attempt.ending, attempt.seconds) == (3, None, None)
    assert history.summary(log) == "attempt 3 on h:1 is running"
    assert history.attempts(None) == [] and history.summary({}) == "-"
    assert attempt.as_json()["claimed_at"] is None
