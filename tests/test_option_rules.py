"""One validator for the options of ``IdempotentTask`` and ``@idempotent``: same rules, same messages."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from django.test import override_settings

from django_idempotent_tasks.decorators import idempotent
from django_idempotent_tasks.exceptions import IdempotencyConfigurationError
from django_idempotent_tasks.tasks import IdempotentTask

# The option's name on a task, where it differs from @idempotent's.
TASK_NAMES = {"scope": "idempotency_scope", "key": "idempotency_key"}
BAD = [
    ("lock_ttl", 0, "a positive int (seconds)"),
    ("record_ttl", 0, "a positive int (seconds)"),
    ("max_attempts", 0, "a positive int"),
    ("lock_ttl", 2.0, "a positive int (seconds)"),
    ("max_attempts", False, "a positive int"),
    ("atomic", None, "True or False"),
    ("scope", "s" * 256, "a non-empty str of at most 255 characters"),
    ("scope", "   ", "a non-empty str"),
    ("key", "  ", "a str.format template, a callable or None"),
]


def bound_task(**options: Any) -> Any:
    app = Celery("rules", set_as_current=False)

    def body(self: Any, value: int) -> int:
        return value

    decorate: Any = app.task
    return decorate(base=IdempotentTask, bind=True, lazy=False, shared=False, name="rules.body", **options)(
        body
    )


def _two(a: int, b: int) -> int:
    return a + b


@pytest.mark.parametrize(("option", "value", "rule"), BAD)
def test_a_task_and_a_function_refuse_the_same_values_with_one_message(
    option: str, value: Any, rule: str
) -> None:
    name = TASK_NAMES.get(option, option)
    with pytest.raises(IdempotencyConfigurationError) as on_task:
        bound_task(**{name: value})
    assert str(on_task.value).startswith(f"Idempotent task 'rules.body': {name}={value!r} is invalid; ")
    assert f"{name} must be {rule}" in str(on_task.value)
    with pytest.raises(IdempotencyConfigurationError) as on_function:
        idempotent(**{option: value})(_two)
    assert f": {option}={value!r} is invalid; {option} must be {rule}" in str(on_function.value)
    assert str(on_function.value).startswith(f"@idempotent on {__name__}._two: ")


def test_each_front_end_names_its_own_conflict_actions() -> None:
    with pytest.raises(IdempotencyConfigurationError, match="must be one of 'retry', 'wait', 'raise'"):
        bound_task(on_conflict="skip")
    with pytest.raises(IdempotencyConfigurationError, match="no broker to re-queue to"):
        idempotent(on_conflict="retry")(_two)
    assert bound_task(on_conflict="retry").idempotency_options.on_conflict == "retry"


def test_none_is_the_setting_in_both_front_ends() -> None:
    task = bound_task(lock_ttl=None, record_ttl=None, max_attempts=None)
    function: Any = idempotent(lock_ttl=None, record_ttl=None, max_attempts=None)(_two)
    with override_settings(
        IDEMPOTENT_TASKS_LOCK_TTL=13, IDEMPOTENT_TASKS_RECORD_TTL=130, IDEMPOTENT_TASKS_MAX_ATTEMPTS=4
    ):
        spec = function.idempotent
        delivery = spec.delivery(spec.prepare((1, 2), {"idempotency_key": "k"}))
        assert (delivery.lock_ttl, delivery.record_ttl, delivery.max_attempts) == (13, 130, 4)
        options = task.idempotency_options
        assert (options.effective_lock_ttl, options.effective_record_ttl) == (13, 130)
        assert options.effective_max_attempts == 4
