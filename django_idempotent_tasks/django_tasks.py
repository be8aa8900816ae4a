"""``@idempotent`` over a ``django.tasks`` task (Django 6) or a backport ``django_tasks`` one."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

from django_idempotent_tasks.exceptions import IdempotencyConfigurationError

TASK_MODULES = ("django.tasks.base", "django_tasks.base")


@functools.cache
def task_classes() -> tuple[type, ...]:
    """The ``Task`` classes of the tasks frameworks installed: Django's own and the backport."""
    found = []
    for name in TASK_MODULES:
        try:
            found.append(importlib.import_module(name).Task)
        except ImportError:
            continue
    return tuple(found)


def is_task(target: object) -> bool:
    """``target`` is a task made by ``@task()`` of ``django.tasks`` or ``django_tasks``."""
    return isinstance(target, task_classes())


def wrap_task(task: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Any:
    """The same task with an idempotent function, whose ``enqueue()`` validates the key first."""
    if task.takes_context:
        raise IdempotencyConfigurationError(
            f"@idempotent cannot wrap the task {task.module_path} yet: it takes a context "
            "(takes_context=True), which is no JSON argument to fingerprint."
        )
    fields = {field.name: getattr(task, field.name) for field in dataclasses.fields(task)}
    cls: type = type(task)
    return validating_class(cls)(**{**fields, "func": wrap(task.func)})


@functools.cache
def validating_class(base: type) -> type:
    """A subclass of a ``Task`` class that checks the idempotency key before anything is stored."""

    def enqueue(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs, _ = self.func.idempotent.prepare(args, kwargs)
        return base.enqueue(self, *args, **kwargs)  # type: ignore[attr-defined]

    async def aenqueue(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs, _ = self.func.idempotent.prepare(args, kwargs)
        return await base.aenqueue(self, *args, **kwargs)  # type: ignore[attr-defined]

    # A module-level name per base, so that pickle (Task.__reduce__) can find the class again.
    name = f"Idempotent{base.__name__}_{base.__module__.replace('.', '__')}"
    namespace = {"__slots__": (), "__module__": __name__, "__qualname__": name}
    cls = type(name, (base,), {**namespace, "enqueue": enqueue, "aenqueue": aenqueue})
    globals()[name] = cls
    return cls
