"""``IdempotentTask``: the Celery base class that makes a task idempotent under a key."""

from __future__ import annotations

import functools
import inspect
import socket
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from celery import shared_task
from celery.contrib.django.task import DjangoTask
from celery.exceptions import Ignore, TimeLimitExceeded
from celery.signals import task_revoked
from celery.utils import uuid
from celery.worker.request import Request

from django_idempotent_tasks import canvas, compat, idempotency, outbox, purging, spec, store, values
from django_idempotent_tasks.conf import conf, conflict_countdown
from django_idempotent_tasks.delivery import Delivery, deliver
from django_idempotent_tasks.exceptions import IdempotencyError, TaskInProgress
from django_idempotent_tasks.idempotency import Idempotency
from django_idempotent_tasks.options import TaskOptions, bind_task, task_options
from django_idempotent_tasks.outcomes import HANDED_ON as HANDED_ON  # still importable from here
from django_idempotent_tasks.outcomes import Busy, Outcome, Requeue
from django_idempotent_tasks.spec import KEY_ARGUMENT, Spec

if TYPE_CHECKING:
    Base = DjangoTask[Any, Any]
else:
    Base = DjangoTask


@dataclass
class _Call:
    """One call of a task's ``__call__`` in progress (kept off ``self.request``, which Celery copies
    into the messages it sends)."""

    task: Any
    task_id: str | None
    sends: list[Callable[[], Any]] = field(default_factory=list)
    handed_on: Ignore | None = None


# The calls in progress in this context, innermost last: a task's own sends wait for its release.
_calls: ContextVar[tuple[_Call, ...]] = ContextVar("django_idempotent_tasks_calls", default=())


def _current(task: Any) -> _Call | None:
    return next((call for call in reversed(_calls.get()) if call.task is task), None)


#: Celery's positional arguments of ``apply_async`` after ``task_id``.
SENDING_ARGUMENTS = ("producer", "link", "link_error", "shadow")
CONFLICTS_HEADER = "idempotency_conflicts"  # how many times this delivery was re-queued by a conflict


class IdempotentRequest(Request):
    """The worker's request of an idempotent task: frees the claim of a body killed by a hard time limit."""

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        # Here rather than in Task.on_failure (which Celery 5.4 does not call on a timeout): only the
        # request knows the killed child's pid, which tells its claim from a redelivery's.
        task: Any = self.task
        if not soft and isinstance(task, IdempotentTask):
            worker = f"{socket.gethostname()}:{self.worker_pid}" if self.worker_pid else None
            task.free_timed_out_claim(self.id, self.kwargs, TimeLimitExceeded(timeout), worker)


class IdempotentTask(Base):
    """A task whose deliveries under one idempotency key run the body at most once."""

    Request = "django_idempotent_tasks.tasks:IdempotentRequest"
    idempotency_key: ClassVar[str | Callable[..., Any] | None] = None
    idempotency_scope: ClassVar[str | None] = None
    lock_ttl: ClassVar[int | None] = None
    record_ttl: ClassVar[int | None] = None
    on_conflict: ClassVar[str] = "retry"
    atomic: ClassVar[bool] = False
    max_attempts: ClassVar[int | None] = None
    outbox: ClassVar[bool | None] = None
    _idempotency_spec: ClassVar[Spec | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        source = cls.__dict__.get("idempotency_key")
        if inspect.isfunction(source):
            cls.idempotency_key = staticmethod(source)  # a callable key source is not a method
        compat.let_argument_through(cls, KEY_ARGUMENT)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Validate and freeze the task's options, body and key template when Celery binds it."""
        super().on_bound(app)
        cls._idempotency_spec = spec.for_task(cls, task_options(cls))
        bind_task(cls, app)  # only a task that passed every check joins the app's bound tasks

    @property
    def idempotency_spec(self) -> Spec:
        """The task's validated options and body, shared by every call."""
        found = type(self).__dict__.get("_idempotency_spec")
        if found is None:  # a subclass of a bound task, not bound itself yet
            found = type(self)._idempotency_spec = spec.for_task(type(self), task_options(self))
        return found

    @property
    def idempotency_options(self) -> TaskOptions:
        """The task's validated options (``None`` fields mean the setting)."""
        return self.idempotency_spec.options

    @property
    def idempotency(self) -> Idempotency:
        """The key, lease and steps of the delivery that is running now."""
        return idempotency.current()

    # Caller side: every way of sending validates the key before anything is sent.

    def resolve_key(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The key of a call: the caller's ``idempotency_key=``, else the task's template or callable."""
        return self.idempotency_spec.resolve_key(args, kwargs)

    def apply_async(
        self, args: Any = None, kwargs: Any = None, task_id: str | None = None, *extra: Any, **options: Any
    ) -> Any:
        checked = canvas.checked(self, args, kwargs, options)
        kwargs = checked.kwargs
        call = _current(self)
        if call is not None and task_id is not None and task_id == call.task_id:
            # self.retry() sends while we still hold the lock: send after the release instead.
            call.sends.append(
                functools.partial(super().apply_async, args, kwargs, task_id, *extra, **options)
            )
            return self.AsyncResult(task_id)
        if self._through_outbox(options):
            options.update(zip(SENDING_ARGUMENTS, extra, strict=False))
            return self._send_through_outbox(checked, args, task_id or uuid(), options)
        return super().apply_async(args, kwargs, task_id, *extra, **options)

    def _through_outbox(self, options: Mapping[str, Any]) -> bool:
        """A new call of an outbox task: not a re-publish, an eager run or a canvas step the worker sends."""
        if not self.idempotency_options.effective_outbox or outbox.is_republishing():
            return False
        if self.app.conf.task_always_eager:
            return False
        # The next step of a chain and a callback are sent by the worker with the parent's id.
        parent, running = options.get("parent_id"), self.app.current_worker_task
        return not (parent is not None and running is not None and running.request.id == parent)

    def _send_through_outbox(
        self, checked: spec.Call, args: Any, task_id: str, options: dict[str, Any]
    ) -> Any:
        """Record the call PENDING in the caller's transaction and publish it after commit, or
        attach to the work already on its way, or replay the stored result."""
        options = {**options, "task_id": task_id}
        stored = outbox.message(self.name, task_id, args, checked.kwargs, options)
        task_options = self.idempotency_options
        call = outbox.Call(
            scope=task_options.scope,
            key=checked.key,
            task_name=self.name,
            fingerprint=checked.fingerprint,
            max_attempts=task_options.effective_max_attempts,
        )
        send = functools.partial(super().apply_async, args, checked.kwargs, **options)
        enqueued = outbox.enqueue(call, stored, send)
        # A key whose body handed on has no value of its own: its delivery answers a replay with
        # Ignore (_answer). The handed-on work's result, if any, is under the first task id (replace
        # freezes the replacement with it), so the caller gets that id's result, as when attaching.
        if enqueued.replayed and enqueued.value != HANDED_ON:
            return outbox.replayed_result(enqueued, self.name)
        return self.AsyncResult(enqueued.task_id)

    def apply(self, args: Any = None, kwargs: Any = None, *extra: Any, **options: Any) -> Any:
        return super().apply(args, canvas.checked(self, args, kwargs, options).kwargs, *extra, **options)

    def apply_async_on_commit(  # type: ignore[override]
        self, args: Any = None, kwargs: Any = None, *extra: Any, **options: Any
    ) -> None:
        kwargs = canvas.checked(self, args, kwargs, options).kwargs
        if self._through_outbox(options):
            # The record is written now, in the caller's transaction; the publish follows its commit.
            self.apply_async(args, kwargs, None, *extra, **options)
            return
        super().apply_async_on_commit(args, kwargs, *extra, **options)

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.apply_async_on_commit(args, kwargs)

    # Worker side (also apply() and direct calls).

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        task_spec = self.idempotency_spec
        prepared = task_spec.prepare(args, kwargs)
        compat.push_task(self)
        compat.push_request_keeping(self, args=args, kwargs=prepared.kwargs)
        request = self.request
        call = _Call(self, request.id)
        token = _calls.set((*_calls.get(), call))
        try:
            no_broker = bool(request.is_eager or request.called_directly or request.id is None)
            delivery = task_spec.delivery(
                prepared, sender=self, task_id=request.id or "", no_broker=no_broker
            )
            body_kwargs = task_spec.body_kwargs(prepared.kwargs)
            outcome = deliver(delivery, functools.partial(self._run_body, call, args, body_kwargs))
        finally:
            _calls.reset(token)
            self.pop_request()
            compat.pop_task()
            for send in call.sends:
                send()
        return self._answer(outcome, call, request, delivery)

    def _answer(self, outcome: Outcome, call: _Call, request: Any, delivery: Delivery) -> Any:
        """The outcome of a delivery in Celery's terms: its value, a re-queue, Ignore or TaskInProgress."""
        if isinstance(outcome, Requeue) or (isinstance(outcome, Busy) and outcome.action == "retry"):
            self._requeue(request)
        if isinstance(outcome, Busy):
            raise TaskInProgress(outcome.message)
        if call.handed_on is not None:
            raise call.handed_on
        if outcome.value == HANDED_ON:
            raise Ignore()  # a replay of a body that replaced itself or raised Ignore
        if delivery.no_broker:  # a caller that ran it in-process: as a plain function's call
            return spec.value_of(outcome, delivery.label)
        return outcome.value  # a worker logged an unstorable result already

    def _run_body(self, call: _Call, args: Sequence[Any], kwargs: dict[str, Any], _: Idempotency) -> Any:
        try:
            return self.run(*args, **kwargs)
        except Ignore as exc:
            # self.replace() and Ignore hand the work on (or drop it) on purpose: the key is done,
            # so a redelivery must not run the body again, and Celery must still see the Ignore.
            call.handed_on = exc
            return HANDED_ON

    def _requeue(self, request: Any) -> NoReturn:
        """Send this delivery again after a countdown, without counting a retry, and ack this one."""
        conflicts = int(getattr(request, CONFLICTS_HEADER, None) or 0)
        countdown = conflict_countdown(conflicts, self.idempotency_options.effective_lock_ttl)
        headers = {CONFLICTS_HEADER: conflicts + 1}
        with outbox.republishing():  # the same message again, never new work for the outbox
            self.signature_from_request(request, countdown=countdown, headers=headers).apply_async()
        raise Ignore()

    def free_timed_out_claim(
        self, task_id: str, kwargs: Any, exc: BaseException, worker: str | None = None
    ) -> None:
        """Mark FAILED the key a delivery killed by a hard time limit still holds (a no-op otherwise)."""
        # The child dies before it can record anything and the message is acked, so free the claim
        # here (in the worker's main process) or the key stays IN_PROGRESS.
        if isinstance(kwargs, dict) and KEY_ARGUMENT in kwargs:
            store.fail_task(
                self.idempotency_options.scope,
                kwargs[KEY_ARGUMENT],
                task_id,
                values.describe_error(exc),
                worker,
            )


@task_revoked.connect(dispatch_uid="django_idempotent_tasks.discarded")
def fail_discarded_message(
    sender: Any = None, request: Any = None, expired: bool = False, **extra: Any
) -> None:
    """A message the worker discarded unrun (revoked, or past its ``expires``) ends its PENDING
    record FAILED: no re-drive sends it again (a revoked call stays cancelled), and the next call
    under its key runs it anew. ``terminate=True`` too: a message a pool process accepted but had
    not begun is still PENDING; a running delivery's record (IN_PROGRESS) is left to its lease."""
    if not isinstance(sender, IdempotentTask) or request is None:
        return
    try:
        key = sender.resolve_key(request.args or (), request.kwargs or {})
    except IdempotencyError:
        return  # a message whose key is missing or bad never had a record
    reason = "Expired" if expired else "Revoked"
    message = f"The message {request.id} was {reason.lower()} before a worker ran it; the body did not run."
    store.fail_pending(sender.idempotency_options.scope, key, request.id, values.error_shape(reason, message))


@shared_task(name="django_idempotent_tasks.purge_expired_records", ignore_result=True)
def purge_expired_records(batch_size: int = 1000) -> int:
    """Delete expired records; schedule it with celery beat."""
    return purging.purge(store.records().expired(), batch_size=batch_size)


@shared_task(name="django_idempotent_tasks.redrive_pending_records", ignore_result=True)
def redrive_pending_records(limit: int = 1000) -> int:
    """Send again the PENDING records whose message never arrived; schedule it with celery beat."""
    return len(outbox.redrive(conf.REDRIVE_AFTER, limit).sent)
