"""``@idempotent``: the lifecycle of ``IdempotentTask`` for any function, Celery or not."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, overload

from django_idempotent_tasks import django_tasks, keys, spec

R = TypeVar("R")


@overload
def idempotent(func: Callable[..., R], /) -> Callable[..., R]: ...


@overload
def idempotent(
    func: None = None,
    /,
    *,
    key: keys.KeySource | None = None,
    scope: str | None = None,
    lock_ttl: int | None = None,
    record_ttl: int | None = None,
    atomic: bool = False,
    max_attempts: int | None = None,
    on_conflict: str = "wait",
) -> Callable[[Any], Any]: ...


def idempotent(
    func: Any = None,
    /,
    *,
    key: keys.KeySource | None = None,
    scope: str | None = None,
    lock_ttl: int | None = None,
    record_ttl: int | None = None,
    atomic: bool = False,
    max_attempts: int | None = None,
    on_conflict: str = "wait",
) -> Any:
    """Make a function (or a ``django.tasks`` task) run at most once per idempotency key."""
    options: dict[str, Any] = {
        "key": key,
        "scope": scope,
        "lock_ttl": lock_ttl,
        "record_ttl": record_ttl,
        "atomic": atomic,
        "max_attempts": max_attempts,
        "on_conflict": on_conflict,
    }

    def decorate(target: Any) -> Any:
        if django_tasks.is_task(target):
            found = spec.for_function(target.func, takes_context=target.takes_context, **options)
            return django_tasks.wrap_task(target, wrap(found))
        return wrap(spec.for_function(target, **options))

    return decorate if func is None else decorate(func)


def wrap(function_spec: spec.Spec) -> Callable[..., Any]:
    """The idempotent version of the spec's function: each call is one delivery."""

    @functools.wraps(function_spec.run)
    def idempotent_function(*args: Any, **kwargs: Any) -> Any:
        return function_spec(*args, **kwargs)

    idempotent_function.idempotent = function_spec  # type: ignore[attr-defined]
    return idempotent_function
