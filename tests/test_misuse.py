"""Loud misuse in the caller: bad arguments and per-call options raise before anything is sent."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from django_idempotent_tasks.exceptions import IdempotencyKeyMismatch, InvalidIdempotencyKey, UnstorableResult
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.testing import assert_runs_once
from tests.test_enqueue import broker, queued  # noqa: F401  (the fixture)
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db


def test_bytes_arguments_are_refused_in_the_caller(broker: Any) -> None:  # noqa: F811
    with pytest.raises(TypeError, match=r"must be JSON values.*bytes are not JSON text"):
        tasks.record_effect.delay(b"\x00\xff", idempotency_key="bytes")
    with pytest.raises(TypeError, match="bytes are not JSON text"):
        tasks.record_effect.apply_async((1,), {"sleep": bytearray(b"1"), "idempotency_key": "bytes"})
    assert queued(broker) == []
    assert not IdempotencyRecord.objects.exists()


def test_a_key_with_a_lone_surrogate_is_refused_in_the_caller(broker: Any) -> None:  # noqa: F811
    with pytest.raises(InvalidIdempotencyKey, match="lone surrogate"):
        tasks.record_effect.delay(1, idempotency_key="order-\udcff")
    assert queued(broker) == []


@pytest.mark.parametrize(
    "option", ["lock_ttl", "record_ttl", "on_conflict", "atomic", "max_attempts", "idempotency_scope"]
)
def test_a_per_task_option_given_to_one_call_is_refused(broker: Any, option: str) -> None:  # noqa: F811
    options: dict[str, Any] = {option: 5}
    with pytest.raises(TypeError, match=rf"{option} is an option of the task.*{option}=\.\.\."):
        tasks.record_effect.apply_async((1,), {"idempotency_key": "per-call"}, **options)
    with pytest.raises(TypeError, match=rf"{option} is an option of the task"):
        tasks.record_effect.s(1, idempotency_key="per-call").set(**options).delay()
    assert queued(broker) == []


def test_a_key_given_as_a_sending_option_is_refused(broker: Any) -> None:  # noqa: F811
    with pytest.raises(TypeError, match="pass it in kwargs"):
        tasks.record_effect.apply_async((1,), idempotency_key="as-option")
    assert queued(broker) == []


def test_a_default_passed_or_left_out_is_the_same_call() -> None:
    first = tasks.record_effect.apply((1,), {"idempotency_key": "defaults"}).get()
    assert tasks.record_effect.apply((1,), {"sleep": 0, "idempotency_key": "defaults"}).get() == first
    assert tasks.record_effect.apply((), {"value": 1, "idempotency_key": "defaults"}).get() == first
    with pytest.raises(IdempotencyKeyMismatch):
        tasks.record_effect.apply((1,), {"sleep": 0.01, "idempotency_key": "defaults"}).get()


def test_datetimes_are_fingerprinted_to_the_microsecond() -> None:
    moment = datetime.datetime(2026, 12, 1, 12, 0, 0, 1000, tzinfo=datetime.timezone.utc)
    tasks.record_effect.apply((moment,), {"idempotency_key": "moment"})
    later = moment + datetime.timedelta(microseconds=1)
    with pytest.raises(IdempotencyKeyMismatch):
        tasks.record_effect.apply((later,), {"idempotency_key": "moment"}).get()


@pytest.mark.parametrize("kind", ["dataclass", "set"])
def test_an_unstorable_result_raises_in_eager_runs_and_the_key_stays_done(kind: str) -> None:
    with pytest.raises(UnstorableResult, match="will not run again.*not JSON serializable"):
        tasks.returns.apply((kind,), {"idempotency_key": kind}).get()
    assert tasks.returns.apply((kind,), {"idempotency_key": kind}).get() is None  # replayed
    assert Effect.objects.count() == 1
    assert IdempotencyRecord.objects.get().status == "SUCCEEDED"
    with pytest.raises(AssertionError, match="UnstorableResult"):
        assert_runs_once(tasks.returns, kind, key=f"helper-{kind}", times=2, threads=False)
    assert tasks.returns.apply(("fixed",), {"idempotency_key": "fixed"}).get() == {"order_id": 7}
