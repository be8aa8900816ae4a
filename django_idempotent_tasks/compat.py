"""Every private Celery and Django API the package leans on, in one place (tests/test_compat.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from celery import _state, canvas
from celery._state import _task_stack  # type: ignore[attr-defined]

#: The class of a chain signature: ``canvas.chain(...)`` builds a ``_chain``.
CHAIN: Any = canvas._chain


def push_task(task: Any) -> None:
    """Make ``task`` Celery's ``current_task`` (what the tracer does around a worker's call)."""
    _task_stack.push(task)


def pop_task() -> None:
    _task_stack.pop()


def push_request_keeping(task: Any, **changes: Any) -> None:
    """Push a request that keeps the current one's id, retries and delivery info, with ``changes``."""
    # Celery 5.5+ merges the current request in push_request; Celery 5.4 would push a bare one, as
    # if the task were called directly.
    task.push_request(**{**vars(task.request), **changes})


def let_argument_through(cls: type, argument: str) -> None:
    """Make Celery's argument check (``Task.typing``, the ``__header__`` of a function task) ignore
    the keyword ``argument``, which the body may not declare."""
    header = cls.__dict__.get("__header__")
    if header is None:
        return
    check: Callable[..., Any] = header.__func__

    @functools.wraps(check)
    def check_arguments(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop(argument, None)
        return check(*args, **kwargs)

    cls.__header__ = staticmethod(check_arguments)  # type: ignore[attr-defined]


def current_app() -> Any:
    """Celery's current or default app, or None; never creates one as ``celery.current_app`` would."""
    return getattr(_state._tls, "current_app", None) or _state.default_app  # type: ignore[attr-defined]


def active_apps() -> list[Any]:
    """Every Celery app of this process that is still alive."""
    return list(_state._get_active_apps())  # type: ignore[attr-defined]


def registered_tasks(app: Any) -> Mapping[str, Any]:
    """The task registry of ``app``; finalizes it only if Celery would on ``app.tasks``."""
    tasks: Mapping[str, Any] = app.tasks if app.finalized or app.autofinalize else app._tasks
    return tasks


def raw_delete(queryset: Any) -> int:
    """One ``DELETE … WHERE`` of ``queryset``: no SELECT first, no signals, no cascade."""
    return int(queryset._raw_delete(queryset.db))


def changelist_params(changelist: Any) -> Mapping[str, Any]:
    """The query parameters a Django admin ChangeList was built from."""
    return changelist.params  # type: ignore[no-any-return]


def is_unfiltered(queryset: Any) -> bool:
    """``queryset`` has no WHERE and no DISTINCT (a changelist of the whole table)."""
    query = getattr(queryset, "query", None)
    return query is not None and not query.where and not query.distinct
