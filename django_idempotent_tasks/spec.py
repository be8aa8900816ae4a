"""The one contract every front end shares: a task's or function's options and body, checked once,
the key and fingerprint of a call, and the ``Delivery`` built from it."""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django_idempotent_tasks import keys
from django_idempotent_tasks.conf import conf
from django_idempotent_tasks.delivery import Delivery, deliver
from django_idempotent_tasks.exceptions import IdempotencyConfigurationError, TaskInProgress, UnstorableResult
from django_idempotent_tasks.idempotency import Idempotency
from django_idempotent_tasks.options import TaskOptions, check_options, freeze
from django_idempotent_tasks.outcomes import Busy, Completed, Outcome, Requeue

KEY_ARGUMENT = "idempotency_key"
ASYNC_BODY = {
    "task": (
        "Idempotent task {name!r} is an async def. Celery calls a task's body as a plain function and "
        "runs coroutines only under an asyncio worker pool, so the coroutine would never be awaited and "
        "the key would be marked done with None. Write the task as a def that runs the coroutine: "
        "return asyncio.run(work(...))."
    ),
    "function": (
        "@idempotent cannot wrap the async function {name}: its lease, heartbeat and fenced "
        "completion are synchronous. Decorate a sync function and call it from async code with "
        "asgiref.sync.sync_to_async(...)."
    ),
}
#: The on_conflict actions of a front end with no broker to re-queue a delivery to.
NO_BROKER_CONFLICTS = ("wait", "raise")
TASK_NAMES = {"key": "idempotency_key", "scope": "idempotency_scope"}
NO_RETRY = '"wait" or "raise" (there is no broker to re-queue to, so no "retry")'


@dataclass(frozen=True)
class Call:
    """One call, checked: its key, the fingerprint of what the caller passed, its kwargs keyed."""

    key: str
    fingerprint: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Spec:
    """One idempotent task or function, validated once; ``name`` is what signals are sent from."""

    options: TaskOptions
    run: Callable[..., Any]  # the body as callers call it (a bound task's without ``self``)
    accepts_key: bool
    required: frozenset[str]

    @property
    def name(self) -> str:
        return self.options.task_name

    @property
    def scope(self) -> str:
        return self.options.scope

    def resolve_key(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The caller's ``idempotency_key=``, else the key derived from the template or callable."""
        if kwargs.get(KEY_ARGUMENT) is not None:
            return keys.validate_key(kwargs[KEY_ARGUMENT])
        if self.options.key_source is None:
            raise keys.missing_key_error(self.name)
        return keys.derive_key(self.options.key_source, self.name, self.run, args, without_key(kwargs))

    def prepare(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call:
        """Check a call as a delivery will: its key, and the fingerprint of the arguments passed.

        Defaults are left out of the fingerprint (``keys.passed_arguments``), so a deploy adding an
        optional parameter keeps the fingerprints of calls made before it.
        """
        key = self.resolve_key(args, kwargs)
        body_kwargs = without_key(kwargs)
        try:
            arguments = keys.passed_arguments(self.run, args, body_kwargs)
            missing = self.required - arguments.keys()
            if missing:
                raise TypeError(f"missing {', '.join(sorted(missing))}")
        except TypeError as exc:
            raise TypeError(f"{self.name}() called with arguments that do not fit: {exc}") from None
        try:
            fingerprint = keys.fingerprint([], arguments)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"The arguments of idempotent task {self.name!r} must be JSON values, so that a "
                f"delivery can fingerprint them: {exc}."
            ) from exc
        return Call(key, fingerprint, {**kwargs, KEY_ARGUMENT: key})

    def body_kwargs(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """What the body is called with: the key only if its signature takes it."""
        return dict(kwargs) if self.accepts_key else without_key(kwargs)

    def delivery(
        self, call: Call, *, sender: Any = None, task_id: str = "", no_broker: bool = True
    ) -> Delivery:
        """The delivery of ``call``; ``no_broker``: a conflict cannot re-queue it (it waits or raises)."""
        options = self.options
        return Delivery(
            sender=self if sender is None else sender,
            task_name=self.name,
            key=call.key,
            scope=options.scope,
            fingerprint=call.fingerprint,
            task_id=task_id,
            lock_ttl=options.effective_lock_ttl,
            record_ttl=options.effective_record_ttl,
            on_conflict=options.on_conflict,
            atomic=options.atomic,
            max_attempts=options.effective_max_attempts,
            max_result_bytes=conf.MAX_RESULT_BYTES,
            no_broker=no_broker,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Deliver one call with no broker behind it (``@idempotent``): its value, or TaskInProgress."""
        call = self.prepare(args, kwargs)
        body_kwargs = self.body_kwargs(call.kwargs)

        def body(idempotency: Idempotency) -> Any:
            return self.run(*args, **body_kwargs)

        delivery = self.delivery(call)
        return value_of(deliver(delivery, body), delivery.label)


def value_of(outcome: Outcome, label: str) -> Any:
    """The value of a delivery with no broker behind it; a key held too long raises TaskInProgress,
    a result that could not be stored UnstorableResult (the key is done: the caller hears of it)."""
    if isinstance(outcome, Busy):  # a delivery with no broker waits or raises, never re-queues
        raise TaskInProgress(outcome.message)
    if isinstance(outcome, Requeue):  # pragma: no cover - a delivery with no broker raises instead
        raise AssertionError(f"A delivery with no broker cannot be re-queued: {outcome.reason}.")
    if isinstance(outcome, Completed) and outcome.unstorable is not None:
        raise UnstorableResult(f"{label} is done and will not run again, but: {outcome.unstorable}")
    return outcome.value


def without_key(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k != KEY_ARGUMENT}


def build(owner: str, name: str, run: Callable[..., Any], options: TaskOptions, kind: str) -> Spec:
    """Check a body and its options (async refusal, key template) and freeze them into a Spec."""
    if inspect.iscoroutinefunction(run) or inspect.isasyncgenfunction(run):
        raise IdempotencyConfigurationError(ASYNC_BODY[kind].format(name=name))
    parameters = keys.signature(run).parameters.values()
    if isinstance(options.key_source, str):
        check_template(owner, run, options.key_source)
    return Spec(
        options=options,
        run=run,
        accepts_key=any(p.name == KEY_ARGUMENT or p.kind is p.VAR_KEYWORD for p in parameters),
        required=frozenset(
            p.name
            for p in parameters
            if p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and p.name != KEY_ARGUMENT
        ),
    )


def for_task(task_class: Any, options: TaskOptions) -> Spec:
    """The spec of an ``IdempotentTask`` class being bound (``on_bound``)."""
    run = task_class.run
    if inspect.isfunction(run) and not isinstance(inspect.getattr_static(task_class, "run"), staticmethod):
        run = run.__get__(object())  # a method: callers never pass ``self``
    return build(f"Idempotent task {task_class.name!r}", task_class.name, run, options, "task")


def for_function(func: Any, *, takes_context: bool = False, **options: Any) -> Spec:
    """The spec of a function under ``@idempotent``; raises IdempotencyConfigurationError."""
    name = dotted_path(func)
    if takes_context:
        raise IdempotencyConfigurationError(
            f"@idempotent cannot wrap the task {name} yet: it takes a context "
            "(takes_context=True), which is no JSON argument to fingerprint."
        )
    owner = f"@idempotent on {name}"
    check_options(owner, options, NO_BROKER_CONFLICTS, NO_RETRY)
    # @idempotent spells two options without the task's "idempotency_" prefix.
    named = {TASK_NAMES.get(option, option): value for option, value in options.items()}
    return build(owner, name, func, freeze(name, named), "function")


def dotted_path(func: Any) -> str:
    if not callable(func) or not hasattr(func, "__qualname__"):
        raise IdempotencyConfigurationError(f"@idempotent decorates a function, got {func!r}.")
    name = f"{func.__module__}.{func.__qualname__}"
    if len(name) > 255:
        raise IdempotencyConfigurationError(f"@idempotent: the dotted path {name} is over 255 characters.")
    return name


def check_template(owner: str, run: Callable[..., Any], template: str) -> None:
    """Every field of the key template names a parameter of ``run``."""
    parameters = keys.signature(run).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as exc:
        raise IdempotencyConfigurationError(f"{owner}: bad key template {template!r}: {exc}.") from None
    for field in fields:
        argument = field.split(".")[0].split("[")[0]
        if not argument or argument.isdigit() or (argument not in parameters and not takes_any):
            raise IdempotencyConfigurationError(
                f"{owner}: the key template {template!r} uses {{{field}}}, which is not "
                f"a parameter of the function (name its parameters, as in {{order_id}})."
            )


def of(target: Any) -> Spec | None:
    """The spec of an idempotent Celery task, ``@idempotent`` function or ``django.tasks`` task."""
    found = getattr(target, "idempotency_spec", None)  # an IdempotentTask (or a shared_task proxy)
    if found is None:
        found = getattr(target, "idempotent", None) or getattr(
            getattr(target, "func", None), "idempotent", None
        )
    return found if isinstance(found, Spec) else None
