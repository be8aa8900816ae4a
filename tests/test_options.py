"""Per-task options are validated and frozen when a task is bound to its app; settings fill ``None``."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_idempotent_tasks.exceptions import IdempotencyConfigurationError, IdempotencyError
from django_idempotent_tasks.tasks import IdempotentTask
from tests.testapp import tasks


def bind(**options: Any) -> Any:
    """Define an idempotent task on a throwaway app, so a refused one never reaches the test app."""
    app = Celery("throwaway", set_as_current=False)

    def body(self: Any, value: int) -> int:
        return value

    decorate: Any = app.task
    return decorate(
        base=IdempotentTask, bind=True, lazy=False, shared=False, name="throwaway.body", **options
    )(body)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lock_ttl", 0),
        ("lock_ttl", 1.5),
        ("lock_ttl", -3),
        ("lock_ttl", True),
        ("record_ttl", 0),
        ("record_ttl", "60"),
        ("max_attempts", 0),
        ("on_conflict", "skip"),
        ("atomic", "yes"),
        ("idempotency_scope", ""),
        ("idempotency_key", ""),
        ("idempotency_key", 42),
    ],
)
def test_a_bad_option_is_refused_when_the_task_is_bound(option: str, value: Any) -> None:
    with pytest.raises(IdempotencyConfigurationError) as caught:
        bind(**{option: value})
    assert f"'throwaway.body': {option}={value!r} is invalid" in str(caught.value)
    assert isinstance(caught.value, ImproperlyConfigured)
    assert isinstance(caught.value, IdempotencyError)


def test_the_options_are_frozen_at_bind() -> None:
    task = bind(lock_ttl=7, record_ttl=70, max_attempts=2, on_conflict="wait", atomic=True)
    options = task.idempotency_options
    assert (options.lock_ttl, options.record_ttl, options.max_attempts) == (7, 70, 2)
    assert (options.on_conflict, options.atomic, options.scope) == ("wait", True, "throwaway.body")
    with pytest.raises(AttributeError):
        options.lock_ttl = 1


def test_none_means_the_setting_read_when_used() -> None:
    options = tasks.record_effect.idempotency_options
    assert (options.lock_ttl, options.record_ttl, options.max_attempts) == (None, None, None)
    with override_settings(
        IDEMPOTENT_TASKS_LOCK_TTL=11, IDEMPOTENT_TASKS_RECORD_TTL=22, IDEMPOTENT_TASKS_MAX_ATTEMPTS=3
    ):
        assert options.effective_lock_ttl == 11
        assert options.effective_record_ttl == 22
        assert options.effective_max_attempts == 3
    assert tasks.short_lease.idempotency_options.effective_lock_ttl == 2


def test_an_async_body_is_refused_when_the_task_is_bound() -> None:
    app = Celery("throwaway", set_as_current=False)

    async def body(self: Any, value: int) -> int:
        return value

    decorate: Any = app.task
    with pytest.raises(IdempotencyConfigurationError) as caught:
        decorate(base=IdempotentTask, bind=True, lazy=False, shared=False, name="throwaway.async")(body)
    message = str(caught.value)
    assert "'throwaway.async' is an async def" in message
    assert "asyncio worker pool" in message
    assert "asyncio.run(" in message


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("order-{order_id}", "uses {order_id}, which is not a parameter"),
        ("order-{0}", "which is not a parameter"),
        ("order-{value", "bad key template"),
    ],
)
def test_a_bad_key_template_is_refused_when_the_task_is_bound(template: str, match: str) -> None:
    with pytest.raises(IdempotencyConfigurationError, match=match) as caught:
        bind(idempotency_key=template)
    assert "Idempotent task 'throwaway.body'" in str(caught.value)


def test_a_good_key_template_is_bound() -> None:
    assert bind(idempotency_key="value-{value}").idempotency_options.key_source == "value-{value}"
