"""Per-task options: one validator for ``IdempotentTask`` and ``@idempotent``, frozen when bound."""

from __future__ import annotations

import dis
import inspect
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import CodeType
from typing import Any

from django_idempotent_tasks.conf import conf
from django_idempotent_tasks.exceptions import IdempotencyConfigurationError

ON_CONFLICT_CHOICES = ("retry", "wait", "raise")
# Every idempotent task class bound to a Celery app (filled in on_bound): what the checks look at.
_bound: weakref.WeakKeyDictionary[type, weakref.ref[Any]] = weakref.WeakKeyDictionary()


UNBOUND_SELF = (
    "Idempotent task {name!r} {uses} but is not bound: Celery passes the task as the first argument "
    "only to a bound task, so self would be the first argument of the call. Add bind=True: "
    "@shared_task(base=IdempotentTask, bind=True)."
)


# co_names also holds attribute names: jira's issue.self or JSON:API's links.self is no use of self.
_NAME_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})


def _loads_name_self(code: CodeType) -> bool:
    """``code`` itself (not a function nested in it) loads a global or name ``self``."""
    if "self" not in code.co_names:  # no disassembly for the bodies that never mention it
        return False
    return any(op.opname in _NAME_LOADS and op.argval == "self" for op in dis.get_instructions(code))


def _reads_global_self(code: CodeType) -> bool:
    """``code`` or a function nested in it reads a global named ``self`` (the task it is not given)."""
    if _loads_name_self(code):
        return True
    return any(isinstance(const, CodeType) and _reads_global_self(const) for const in code.co_consts)


def unbound_self_error(task_class: type) -> str | None:
    """Why a task built from a function without ``bind=True`` cannot run as written, or None."""
    run = task_class.__dict__.get("run")
    if not isinstance(run, staticmethod):
        return None  # bind=True, or a class-based task whose run is a method
    function = inspect.unwrap(run.__func__)
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    if code.co_argcount and code.co_varnames[0] == "self":
        uses = "takes self as its first parameter"
    elif _reads_global_self(code):
        uses = "uses self (self.idempotency, self.retry)"
    else:
        return None
    return UNBOUND_SELF.format(name=getattr(task_class, "name", function.__name__), uses=uses)


@dataclass(frozen=True)
class TaskOptions:
    """A task's own options, checked once when it is bound; ``None`` means "the setting"."""

    task_name: str
    scope: str
    key_source: str | Callable[..., Any] | None
    lock_ttl: int | None
    record_ttl: int | None
    on_conflict: str
    atomic: bool
    max_attempts: int | None
    outbox: bool | None = None

    # Settings are read at use, not at bind: tasks are bound before override_settings applies, and
    # reading a setting is one attribute lookup.
    @property
    def effective_lock_ttl(self) -> int:
        """``lock_ttl``, else IDEMPOTENT_TASKS_LOCK_TTL."""
        return conf.LOCK_TTL if self.lock_ttl is None else self.lock_ttl

    @property
    def effective_record_ttl(self) -> int:
        """``record_ttl``, else IDEMPOTENT_TASKS_RECORD_TTL."""
        return conf.RECORD_TTL if self.record_ttl is None else self.record_ttl

    @property
    def effective_max_attempts(self) -> int:
        """``max_attempts``, else IDEMPOTENT_TASKS_MAX_ATTEMPTS."""
        return conf.MAX_ATTEMPTS if self.max_attempts is None else self.max_attempts

    @property
    def effective_outbox(self) -> bool:
        """``outbox``, else IDEMPOTENT_TASKS_OUTBOX."""
        return conf.OUTBOX if self.outbox is None else self.outbox


def _positive_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0)


def _scope(value: Any) -> bool:
    return value is None or (isinstance(value, str) and bool(value.strip()) and len(value) <= 255)


def _key_source(value: Any) -> bool:
    return value is None or callable(value) or (isinstance(value, str) and bool(value.strip()))


_SECONDS = "a positive int (seconds), or None (use the setting)"
_POSITIVE = "a positive int, or None (use the setting)"
_SCOPE = "a non-empty str of at most 255 characters, or None (the task's name)"
_KEY = "a str.format template, a callable or None (the caller passes idempotency_key=)"
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "lock_ttl": (_positive_or_none, _SECONDS),
    "record_ttl": (_positive_or_none, _SECONDS),
    "max_attempts": (_positive_or_none, _POSITIVE),
    "atomic": (lambda value: isinstance(value, bool), "True or False"),
    "outbox": (
        lambda value: value is None or isinstance(value, bool),
        "True, False or None (use the setting)",
    ),
    "scope": (_scope, _SCOPE),
    "idempotency_scope": (_scope, _SCOPE),
    "key": (_key_source, _KEY),
    "idempotency_key": (_key_source, _KEY),
}


def check_options(
    owner: str,
    options: Mapping[str, Any],
    conflicts: tuple[str, ...] = ON_CONFLICT_CHOICES,
    conflict_rule: str = "one of 'retry', 'wait', 'raise'",
) -> None:
    """Raise IdempotencyConfigurationError naming ``owner`` and the first bad option (0 is one)."""
    for option, value in options.items():
        if option == "on_conflict":
            valid, rule = value in conflicts, conflict_rule
        else:
            check, rule = RULES[option]
            valid = check(value)
        if not valid:
            raise IdempotencyConfigurationError(
                f"{owner}: {option}={value!r} is invalid; {option} must be {rule}."
            )


TASK_OPTIONS: tuple[str, ...] = ("idempotency_key", "idempotency_scope", "lock_ttl", "record_ttl")
TASK_OPTIONS += ("on_conflict", "atomic", "max_attempts", "outbox")


def task_options(task: Any) -> TaskOptions:
    """Validate the options of an idempotent task (class or instance) and freeze them."""
    name = task.name
    values = {option: getattr(task, option) for option in TASK_OPTIONS}
    check_options(f"Idempotent task {name!r}", values)
    return freeze(name, values)


def freeze(name: str, values: Mapping[str, Any]) -> TaskOptions:
    """The checked options of task or function ``name``, by their names on a task."""
    return TaskOptions(
        task_name=name,
        scope=values["idempotency_scope"] or name,
        key_source=values["idempotency_key"],
        lock_ttl=values["lock_ttl"],
        record_ttl=values["record_ttl"],
        on_conflict=values["on_conflict"],
        atomic=values["atomic"],
        max_attempts=values["max_attempts"],
        outbox=values.get("outbox"),
    )


def bind_task(task_class: type, app: Any) -> TaskOptions:
    """Validate and freeze the options of a task class bound to ``app``, and remember the pair."""
    unbound = unbound_self_error(task_class)
    if unbound is not None:
        raise IdempotencyConfigurationError(unbound)
    options = task_options(task_class)
    _bound[task_class] = weakref.ref(app)
    return options


def is_idempotent(task: Any) -> bool:
    """``task`` is an instance of an idempotent task class bound to an app."""
    return type(task) in _bound


def bound_tasks(app: Any) -> list[str]:
    """The names of the idempotent tasks bound to ``app``, sorted."""
    return sorted({cls.name for cls, ref in list(_bound.items()) if ref() is app})  # type: ignore[attr-defined]


def apps_with_bound_tasks() -> set[Any]:
    """The live Celery apps that idempotent tasks are bound to."""
    return {app for ref in list(_bound.values()) if (app := ref()) is not None}
