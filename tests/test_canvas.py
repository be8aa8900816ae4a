"""A canvas with an idempotent member that a worker would refuse sends nothing."""

from __future__ import annotations

from typing import Any

import pytest
from celery import canvas as celery_canvas
from celery import chain, chord, group

from django_idempotent_tasks import canvas as idempotent_canvas
from django_idempotent_tasks.exceptions import InvalidIdempotencyKey, MissingIdempotencyKey
from django_idempotent_tasks.tasks import purge_expired_records
from tests.test_enqueue import broker, queued  # noqa: F401  (the fixture)
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def good(n: int) -> Any:
    return tasks.record_effect.si(n, idempotency_key=f"canvas-{n}")


def test_a_chain_with_a_keyless_later_link_sends_nothing(broker: Any) -> None:  # noqa: F811
    with pytest.raises(MissingIdempotencyKey, match="send_receipt"):
        chain(good(1), tasks.send_receipt.si(order_id=1)).apply_async()
    with pytest.raises(MissingIdempotencyKey, match="send_receipt"):
        (good(1) | tasks.send_receipt.s(order_id=1)).delay()
    assert queued(broker) == []


def test_a_group_with_a_keyless_last_member_sends_nothing(broker: Any) -> None:  # noqa: F811
    with pytest.raises(MissingIdempotencyKey):
        group([good(1), good(2), tasks.record_effect.si(3)]).apply_async()
    with pytest.raises(InvalidIdempotencyKey):
        group([good(1), tasks.record_effect.si(3, idempotency_key="")]).apply_async()
    assert queued(broker) == []


def test_a_chord_with_a_keyless_header_member_or_body_sends_nothing(broker: Any) -> None:  # noqa: F811
    with pytest.raises(MissingIdempotencyKey):
        chord([good(1), tasks.record_effect.si(2)])(tasks.send_receipt.s(idempotency_key="receipt"))
    with pytest.raises(MissingIdempotencyKey):
        chord([good(1), good(2)])(tasks.send_receipt.s())
    assert queued(broker) == []


def test_callbacks_are_checked_before_the_task_is_sent(broker: Any) -> None:  # noqa: F811
    with pytest.raises(MissingIdempotencyKey):
        good(1).apply_async(link=tasks.send_receipt.s())
    with pytest.raises(MissingIdempotencyKey):
        good(1).apply_async(link_error=[tasks.send_receipt.si()])
    assert queued(broker) == []


def test_a_well_keyed_canvas_is_sent(broker: Any) -> None:  # noqa: F811
    chain(good(1), tasks.send_receipt.s(order_id=1, idempotency_key="receipt-1")).apply_async()
    group([good(2), good(3)]).apply_async()
    # A later link with a key template or callable is derived in the worker, from the parent's result.
    (good(4) | tasks.charge_order.s()).apply_async()
    assert len(queued(broker)) == 4


def test_callbacks_given_as_dicts_and_later_links_own_callbacks_and_options_are_checked(broker: Any) -> None:  # noqa: F811
    with pytest.raises(MissingIdempotencyKey):
        good(1).apply_async(link=dict(tasks.send_receipt.s()))  # a callback as it travels in a message
    with pytest.raises(MissingIdempotencyKey):  # a later link's own callback
        chain(
            good(1), tasks.send_receipt.s(idempotency_key="r").set(link=tasks.send_receipt.s())
        ).apply_async()
    with pytest.raises(TypeError, match="lock_ttl is an option of the task"):
        chain(good(1), tasks.send_receipt.s(idempotency_key="r").set(lock_ttl=5)).apply_async()  # type: ignore[call-arg]
    with pytest.raises(InvalidIdempotencyKey):
        chain(good(1), tasks.send_receipt.s(idempotency_key="bad\nkey")).apply_async()
    assert queued(broker) == []


def test_members_that_are_not_idempotent_are_sent_unchecked(broker: Any) -> None:  # noqa: F811
    group([good(1), purge_expired_records.si()]).apply_async()
    assert sorted(message["headers"]["task"] for message in queued(broker)) == [
        purge_expired_records.name,
        tasks.record_effect.name,
    ]


def test_installing_the_canvas_check_twice_wraps_once() -> None:
    wrapped = [kind.apply_async for kind in (celery_canvas._chain, celery_canvas.group, celery_canvas.chord)]
    idempotent_canvas.install()
    assert [
        kind.apply_async for kind in (celery_canvas._chain, celery_canvas.group, celery_canvas.chord)
    ] == wrapped
