"""Check every idempotent member of a canvas (chain, group, chord, callbacks) before any is sent."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from celery import canvas

from django_idempotent_tasks import compat, keys
from django_idempotent_tasks.options import is_idempotent
from django_idempotent_tasks.spec import KEY_ARGUMENT, Call

PER_TASK_OPTIONS = frozenset(
    {
        KEY_ARGUMENT,
        "idempotency_scope",
        "lock_ttl",
        "record_ttl",
        "on_conflict",
        "atomic",
        "max_attempts",
        "outbox",
    }
)
CALLBACK_OPTIONS = ("link", "link_error", "chain", "chord")


def per_call_error(task_name: str, options: Mapping[str, Any]) -> TypeError | None:
    """The error for a per-task option given to one call (it would be ignored), or None."""
    given = sorted(PER_TASK_OPTIONS & options.keys())
    if not given:
        return None
    option, value = given[0], options[given[0]]
    if option == KEY_ARGUMENT:
        return TypeError(
            f"{task_name}: idempotency_key is an argument of the task, not a sending option: pass it in "
            f"kwargs (apply_async(args, {{'idempotency_key': {value!r}}}) or delay(..., idempotency_key=...))."
        )
    return TypeError(
        f"{task_name}: {option} is an option of the task, not of one call, so {option}={value!r} would "
        f"be ignored. Set it on the task: @shared_task(base=IdempotentTask, {option}=...)."
    )


def _members(signature: Any, partial: bool) -> Iterator[tuple[Any, bool]]:
    """(plain signature, gets a parent's result prepended) for every task a canvas would send."""
    if signature is None:
        return
    if isinstance(signature, Mapping) and not isinstance(signature, canvas.Signature):
        signature = canvas.Signature.from_dict(dict(signature))
    if isinstance(signature, (list, tuple)):
        for member in signature:
            yield from _members(member, partial)
        return
    if isinstance(signature, compat.CHAIN):
        for index, member in enumerate(signature.tasks):
            yield from _members(member, partial or index > 0)
    elif isinstance(signature, canvas.group):
        yield from _members(list(signature.tasks), partial)
    elif isinstance(signature, canvas.chord):
        yield from _members(list(signature.tasks), partial)
        yield from _members(signature.body, True)
    else:
        yield signature, partial and not signature.immutable
    for option in CALLBACK_OPTIONS:
        if signature.options.get(option):
            yield from _members(signature.options[option], True)


def check(signature: Any, partial: bool = False) -> None:
    """Raise the caller's error of the first idempotent member that a worker would refuse."""
    for member, gets_result in _members(signature, partial):
        task = member.app.tasks.get(member.task)
        if is_idempotent(task):
            check_member(task, member.args, member.kwargs, member.options, partial=gets_result)


def check_member(
    task: Any, args: Sequence[Any], kwargs: Mapping[str, Any], options: Mapping[str, Any], partial: bool
) -> None:
    """Raise what a worker would refuse in one member; ``partial``: a parent's result comes first."""
    if not partial:
        checked(task, args, kwargs, options)
    elif (error := per_call_error(task.name, options)) is not None:
        raise error
    elif kwargs.get(KEY_ARGUMENT) is not None:
        keys.validate_key(kwargs[KEY_ARGUMENT])
    elif task.idempotency_options.key_source is None:
        raise keys.missing_key_error(task.name)


def checked(
    task: Any, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None, options: Mapping[str, Any]
) -> Call:
    """One message of ``task``, checked as a worker will check it; raises on misuse."""
    error = per_call_error(task.name, options)
    if error is not None:
        raise error
    check_callbacks(options)
    return task.idempotency_spec.prepare(args or (), kwargs or {})  # type: ignore[no-any-return]


def check_callbacks(options: Mapping[str, Any]) -> None:
    """Check the callbacks (link, link_error) and the rest of a chain that travel with one message."""
    for option in CALLBACK_OPTIONS:
        if options.get(option):
            check(options[option], partial=True)


def _checked(send: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(send)
    def apply_async(self: Any, *args: Any, **kwargs: Any) -> Any:
        check(self)
        call_kwargs = kwargs.get("kwargs", args[1] if len(args) > 1 else None)
        if isinstance(call_kwargs, Mapping) and isinstance(self, canvas.chord):
            check(call_kwargs.get("body"), partial=True)  # chord(header)(body) passes it here
        return send(self, *args, **kwargs)

    apply_async.__idempotency_checked__ = True  # type: ignore[attr-defined]
    return apply_async


def install() -> None:
    """Make chain, group and chord check their idempotent members before sending the first one."""
    # Celery sends a group's members one by one and a chain's later links from the worker, so a
    # bad member is only seen after others went out; checking the whole canvas first needs this hook.
    for kind in (compat.CHAIN, canvas.group, canvas.chord):
        if not getattr(kind.apply_async, "__idempotency_checked__", False):
            kind.apply_async = _checked(kind.apply_async)  # type: ignore[method-assign]
