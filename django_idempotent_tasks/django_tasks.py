"""``@idempotent`` over a ``django.tasks`` task (Django 6) or a backport ``django_tasks`` one."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

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


def wrap_task(task: Any, func: Callable[..., Any]) -> Any:
    """The same task running the idempotent ``func``, whose ``enqueue()`` validates the key first."""
    fields = {field.name: getattr(task, field.name) for field in dataclasses.fields(task)}
    cls: type = type(task)
    return validating_class(cls)(**{**fields, "func": func})


@functools.cache
def validating_class(base: type) -> type:
    """A subclass of a ``Task`` class that checks the idempotency key before anything is stored."""

    def enqueue(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs = self.func.idempotent.prepare(args, kwargs).kwargs
        return base.enqueue(self, *args, **kwargs)  # type: ignore[attr-defined]

    async def aenqueue(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs = self.func.idempotent.prepare(args, kwargs).kwargs
        return await base.aenqueue(self, *args, **kwargs)  # type: ignore[attr-defined]

    # A module-level name per base, so that pickle (Task.__reduce__) can find the class again.
    name = f"Idempotent{base.__name__}_{base.__module__.replace('.', '__')}"
    namespace = {"__slots__": (), "__module__": __name__, "__qualname__": name}
    cls = type(name, (base,), {**namespace, "enqueue": enqueue, "aenqueue": aenqueue})
    globals()[name] = cls
    return cls
