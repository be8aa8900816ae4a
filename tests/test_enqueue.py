"""Every way of sending validates the key in the caller, before anything is sent."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import transaction

from django_idempotent_tasks.exceptions import InvalidIdempotencyKey, MissingIdempotencyKey
from django_idempotent_tasks.models import IdempotencyRecord
from tests.celery_app import app as celery_app
from tests.testapp import tasks

# No worker consumes this queue, so what was sent stays there to be inspected even while the
# session's workers (started by the worker tests) are running.
QUEUE = "enqueue-tests"


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    default = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = QUEUE
    try:
        yield redis.Redis.from_url(settings.CELERY_BROKER_URL)
    finally:
        celery_app.conf.task_default_queue = default


def queued(broker: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in broker.lrange(QUEUE, 0, -1)]


def bodies(broker: redis.Redis) -> list[str]:
    """The decoded bodies of the queued messages, oldest first."""
    return [base64.b64decode(message["body"]).decode() for message in reversed(queued(broker))]


def test_missing_key_names_the_task_and_how_to_pass_one(broker: redis.Redis) -> None:
    with pytest.raises(MissingIdempotencyKey, match=r"tests.testapp.tasks.record_effect.*idempotency_key="):
        tasks.record_effect.delay(1)
    assert queued(broker) == []


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", " ", 7, None, "x" * 256, "nul\x00"])
@pytest.mark.parametrize("send", ["delay", "apply_async", "signature", "apply", "on_commit"])
def test_bad_keys_raise_before_anything_is_sent(broker: redis.Redis, send: str, key: Any) -> None:
    kwargs = {"idempotency_key": key}
    expected = MissingIdempotencyKey if key is None else InvalidIdempotencyKey
    with pytest.raises(expected):
        if send == "delay":
            tasks.record_effect.delay(1, **kwargs)
        elif send == "apply_async":
            tasks.record_effect.apply_async((1,), kwargs)
        elif send == "signature":
            tasks.record_effect.s(1, **kwargs).delay()
        elif send == "apply":
            tasks.record_effect.apply((1,), kwargs)
        else:
            tasks.record_effect.delay_on_commit(1, **kwargs)
    assert queued(broker) == []
    assert not IdempotencyRecord.objects.exists()


def test_the_key_travels_as_a_keyword_argument(broker: redis.Redis) -> None:
    tasks.record_effect.delay(1, idempotency_key="k-1")
    [message] = queued(broker)
    assert message["headers"]["task"] == "tests.testapp.tasks.record_effect"
    assert '"idempotency_key": "k-1"' in bodies(broker)[0]


def test_a_template_derives_the_key_at_enqueue_and_an_explicit_key_wins(broker: redis.Redis) -> None:
    tasks.charge_order.delay(42)
    tasks.charge_order.delay(42, idempotency_key="explicit")
    tasks.charge_order_callable.delay(7)
    sent = bodies(broker)
    assert ['"order-42"' in sent[0], '"explicit"' in sent[1], '"callable-7"' in sent[2]] == [True] * 3


def test_wrong_arguments_still_raise_type_error_with_the_key_accepted() -> None:
    with pytest.raises(TypeError):
        tasks.record_effect.delay(1, 2, 3, 4, idempotency_key="k")
    with pytest.raises(TypeError):
        tasks.record_effect.delay(1, unknown=True, idempotency_key="k")


@pytest.mark.django_db(transaction=True)
def test_on_commit_validates_now_and_sends_after_commit(broker: redis.Redis) -> None:
    with transaction.atomic():
        tasks.record_effect.delay_on_commit(1, idempotency_key="after-commit")
        tasks.record_effect.apply_async_on_commit((2,), {"idempotency_key": "after-commit-2"})
        assert queued(broker) == []
    assert len(queued(broker)) == 2
