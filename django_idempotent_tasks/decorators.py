"""``@idempotent``: the lifecycle of ``IdempotentTask`` for any function, Celery or not."""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from django_idempotent_tasks import django_tasks, keys
from django_idempotent_tasks.conf import conf
from django_idempotent_tasks.delivery import Body, Delivery, deliver
from django_idempotent_tasks.exceptions import IdempotencyConfigurationError, TaskInProgress
from django_idempotent_tasks.options import check_options
from django_idempotent_tasks.outcomes import Busy, Requeue

R = TypeVar("R")
KEY_ARGUMENT = "idempotency_key"
ON_CONFLICT_CHOICES = ("wait", "raise")
NO_RETRY = '"wait" or "raise" (there is no broker to re-queue to, so no "retry")'


@dataclass(frozen=True)
class IdempotentFunction:
    """The options of one ``@idempotent`` function, validated when it is decorated."""

    func: Callable[..., Any]
    name: str
    key: keys.KeySource | None
    scope: str
    lock_ttl: int | None
    record_ttl: int | None
    atomic: bool
    max_attempts: int | None
    on_conflict: str
    accepts_key: bool

    def resolve_key(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The caller's ``idempotency_key=``, else the key derived from the template or callable."""
        if kwargs.get(KEY_ARGUMENT) is not None:
            return keys.validate_key(kwargs[KEY_ARGUMENT])
        if self.key is None:
            raise keys.missing_key_error(self.name)
        return keys.derive_key(self.key, self.name, self.func, args, _without_key(kwargs))

    def prepare(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
        """Validate a call in the caller: its kwargs with the key set, and its fingerprint."""
        keyed = {**kwargs, KEY_ARGUMENT: self.resolve_key(args, kwargs)}
        return keyed, self.fingerprint(args, keyed)

    def fingerprint(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        body_kwargs = _without_key(kwargs)
        try:
            inspect.signature(self.func).bind(*args, **(kwargs if self.accepts_key else body_kwargs))
        except TypeError as exc:
            raise TypeError(f"{self.name}() called with arguments that do not fit: {exc}") from None
        return keys.fingerprint([], keys.bind_arguments(self.func, args, body_kwargs))

    def delivery(self, key: str, fingerprint: str) -> Delivery:
        return Delivery(
            sender=self.func,
            task_name=self.name,
            key=key,
            scope=self.scope,
            fingerprint=fingerprint,
            task_id="",
            lock_ttl=conf.LOCK_TTL if self.lock_ttl is None else self.lock_ttl,
            record_ttl=conf.RECORD_TTL if self.record_ttl is None else self.record_ttl,
            on_conflict=self.on_conflict,
            atomic=self.atomic,
            max_attempts=conf.MAX_ATTEMPTS if self.max_attempts is None else self.max_attempts,
            max_result_bytes=conf.MAX_RESULT_BYTES,
            eager=True,  # no broker: a conflict waits or raises, and Redis trouble falls back to the lease
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs, fingerprint = self.prepare(args, kwargs)
        body_kwargs = kwargs if self.accepts_key else _without_key(kwargs)
        delivery = self.delivery(kwargs[KEY_ARGUMENT], fingerprint)
        return run(delivery, lambda idempotency: self.func(*args, **body_kwargs))


def run(delivery: Delivery, body: Body) -> Any:
    """Deliver one call of an ``@idempotent`` function (the one place that calls ``deliver``)."""
    outcome = deliver(delivery, body)
    if isinstance(outcome, Busy):  # an eager delivery waits or raises, never re-queues
        raise TaskInProgress(outcome.message)
    if isinstance(outcome, Requeue):  # pragma: no cover - an eager delivery raises instead
        raise AssertionError(f"An @idempotent call has no broker to be re-queued to: {outcome.reason}.")
    return outcome.value


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
    options = {
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
            return django_tasks.wrap_task(target, lambda function: wrap(function, **options))
        return wrap(target, **options)

    return decorate if func is None else decorate(func)


def wrap(func: Any, **options: Any) -> Callable[..., Any]:
    """The idempotent version of ``func``, its options validated now."""
    spec = describe(func, **options)

    @functools.wraps(func)
    def idempotent_function(*args: Any, **kwargs: Any) -> Any:
        return spec(*args, **kwargs)

    idempotent_function.idempotent = spec  # type: ignore[attr-defined]
    return idempotent_function


def describe(func: Any, **options: Any) -> IdempotentFunction:
    """Validate ``func`` and the options of ``@idempotent``; raises IdempotencyConfigurationError."""
    name = _dotted_path(func)
    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        raise IdempotencyConfigurationError(
            f"@idempotent cannot wrap the async function {name}: its lease, heartbeat and fenced "
            "completion are synchronous. Decorate a sync function and call it from async code with "
            "asgiref.sync.sync_to_async(...)."
        )
    _check_options(name, func, options)
    parameters = inspect.signature(func).parameters.values()
    return IdempotentFunction(
        func=func,
        name=name,
        key=options["key"],
        scope=options["scope"] or name,
        lock_ttl=options["lock_ttl"],
        record_ttl=options["record_ttl"],
        atomic=options["atomic"],
        max_attempts=options["max_attempts"],
        on_conflict=options["on_conflict"],
        accepts_key=any(
            p.name == KEY_ARGUMENT or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
        ),
    )


def _dotted_path(func: Any) -> str:
    if not callable(func) or not hasattr(func, "__qualname__"):
        raise IdempotencyConfigurationError(f"@idempotent decorates a function, got {func!r}.")
    name = f"{func.__module__}.{func.__qualname__}"
    if len(name) > 255:
        raise IdempotencyConfigurationError(f"@idempotent: the dotted path {name} is over 255 characters.")
    return name


def _check_options(name: str, func: Any, options: Mapping[str, Any]) -> None:
    check_options(f"@idempotent on {name}", options, ON_CONFLICT_CHOICES, NO_RETRY)
    if isinstance(options["key"], str):
        _check_template(name, func, options["key"])


def _check_template(name: str, func: Any, template: str) -> None:
    """Every field of the key template names a parameter of ``func``."""
    parameters = inspect.signature(func).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as exc:
        raise IdempotencyConfigurationError(
            f"@idempotent on {name}: bad key template {template!r}: {exc}."
        ) from None
    for field in fields:
        argument = field.split(".")[0].split("[")[0]
        if not argument or argument.isdigit() or (argument not in parameters and not takes_any):
            raise IdempotencyConfigurationError(
                f"@idempotent on {name}: the key template {template!r} uses {{{field}}}, which is not "
                f"a parameter of the function (name its parameters, as in {{order_id}})."
            )


def _without_key(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k != KEY_ARGUMENT}
