"""The caller-side lifecycle of an outbox task: the PENDING record written in the caller's
transaction, attach and replay at the caller, and the re-drive of messages that never arrived."""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery import states
from celery.result import EagerResult
from celery.utils import uuid
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from kombu.exceptions import OperationalError as BrokerError
from kombu.exceptions import SerializationError, SerializerNotInstalled
from kombu.utils import json as kombu_json

from django_idempotent_tasks import compat, keys, store, values
from django_idempotent_tasks.exceptions import (
    AttemptsExhausted,
    IdempotencyError,
    IdempotencyKeyMismatch,
    OutboxError,
)
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.options import apps_with_bound_tasks

logger = logging.getLogger("django_idempotent_tasks")
Status = IdempotencyRecord.Status

#: The sending options a stored message keeps: where it goes and when, nothing else.
ROUTING = ("queue", "routing_key", "exchange", "priority", "headers")
#: Options that hold signatures (callbacks, the rest of a chain, a chord's body) or place the call in
#: a canvas: kept, so a re-send loses no canvas.
CANVAS = ("link", "link_error", "chain", "chord", "group_id", "group_index", "root_id", "parent_id")
#: The options whose work follows the task's own: only a worker that delivers the message sends the
#: next step, the callbacks or the chord's body, so a call carrying one is always published.
CONTINUATIONS = ("link", "link_error", "chain", "chord")

# Set while the package itself re-publishes a call (the re-drive, "Send again", a conflict's
# re-queue): such a send is the same work on its way again, never new work for the outbox.
_republishing: ContextVar[bool] = ContextVar("django_idempotent_tasks_republishing", default=False)


if TYPE_CHECKING:
    FinishedResult = EagerResult[Any]
else:  # Celery 5.4's EagerResult is not subscriptable at run time
    FinishedResult = EagerResult


class ReplayedResult(FinishedResult):
    """The finished result of a key that had already succeeded: nothing was sent."""

    replayed = True


@contextlib.contextmanager
def republishing() -> Iterator[None]:
    """Sends made inside are re-publishes of work already recorded: they bypass the outbox."""
    token = _republishing.set(True)
    try:
        yield
    finally:
        _republishing.reset(token)


def is_republishing() -> bool:
    return _republishing.get()


def _name(value: Any) -> Any:
    return getattr(value, "name", value)  # a kombu Queue or Exchange: its name


def _utc_now() -> datetime.datetime:
    # Aware UTC whatever USE_TZ says: under USE_TZ=False timezone.now() is naive local time, which
    # Celery's worker (and _as_utc) would read as UTC.
    return datetime.datetime.now(datetime.timezone.utc)


def _as_utc(value: datetime.datetime) -> datetime.datetime:
    """A naive time read as UTC, as Celery's worker reads a naive ETA (maybe_make_aware)."""
    return value.replace(tzinfo=datetime.timezone.utc) if timezone.is_naive(value) else value


#: What Celery's apply_async takes for each time option (celery.app.amqp), and how errors say it.
_TIME_OPTIONS: dict[str, tuple[tuple[type, ...], str]] = {
    "countdown": ((int, float), "a number of seconds"),
    "eta": ((datetime.datetime, str), "a datetime or an ISO 8601 datetime string"),
    "expires": (
        (int, float, datetime.datetime, str),
        "a number of seconds, a datetime or an ISO 8601 datetime string",
    ),
}


def _absolute(option: str, value: Any, now: datetime.datetime) -> str | None:
    """The ``countdown``, ``eta`` or ``expires`` option as an absolute ISO time in UTC; a
    TypeError or ValueError naming the option for a value Celery would not take."""
    if value is None:
        return None
    kinds, accepted = _TIME_OPTIONS[option]
    if not isinstance(value, kinds):
        raise TypeError(f"{option} must be {accepted}, not {type(value).__name__} ({value!r}).")
    if isinstance(value, (int, float)):
        value = now + datetime.timedelta(seconds=value)
    elif isinstance(value, str):
        value = _parsed(option, value, accepted)
    return str(_as_utc(value).astimezone(datetime.timezone.utc).isoformat())


def _parsed(option: str, text: str, accepted: str) -> datetime.datetime:
    try:
        parsed = parse_datetime(text)  # None when malformed, ValueError when out of range
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValueError(f"{option} must be {accepted}: {text!r} is not an ISO 8601 datetime.")
    return parsed


def message(
    task_name: str,
    task_id: str,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any],
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """The stored message of a call: enough to publish it again, exactly, under its task id.

    The arguments and callbacks go through kombu's JSON encoding, which keeps the types Celery's
    JSON serializer keeps (datetime, Decimal, UUID): a re-sent call has the fingerprint of the first.
    """
    now = _utc_now()
    sending = {name: _name(options[name]) for name in ROUTING if options.get(name) is not None}
    when = "countdown" if options.get("countdown") else "eta"  # as Celery: a countdown wins
    eta = _absolute(when, options.get(when), now)
    expires = _absolute("expires", options.get("expires"), now)
    canvas = {name: options[name] for name in CANVAS if options.get(name) is not None}
    call = {"args": list(args or ()), "kwargs": dict(kwargs), **canvas}
    return {
        "task": task_name,
        "id": task_id,
        "call": storable_call(task_name, json.loads(kombu_json.dumps(call))),
        "options": sending,
        "eta": eta,
        "expires": expires,
        "sent_at": now.isoformat(),
    }


def storable_call(task_name: str, call: dict[str, Any]) -> dict[str, Any]:
    """``call`` (its JSON form), or an OutboxError when its record's JSON column cannot hold it: a
    NaN or an infinity, a NUL, a lone surrogate, nesting deeper than MariaDB stores."""
    _, problem = values.encode_result(call, sys.maxsize, store.json_depth_limit(inside=1), what="The call")
    if problem is not None:
        raise OutboxError(
            f"{task_name} cannot go through the outbox, which stores each call in its record: "
            f"{problem} Nothing was written or sent."
        )
    return call


def _decoded(stored: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """The args, kwargs and sending options of a stored message."""
    call = kombu_json.loads(json.dumps(stored["call"]))
    options = dict(stored.get("options") or {})
    options.update({name: call[name] for name in CANVAS if call.get(name) is not None})
    for name in ("eta", "expires"):
        if stored.get(name):
            options[name] = parse_datetime(stored[name])
    return list(call["args"]), dict(call["kwargs"]), options


def celery_app() -> Any:
    """The project's Celery app (current, or the one holding idempotent tasks); never Celery's
    default app, which would publish to a broker nobody configured."""
    app = compat.current_app()
    if app is None:
        bound = apps_with_bound_tasks()
        app = bound.pop() if len(bound) == 1 else None
    if app is None:
        raise OutboxError(
            "No Celery app is loaded in this process, so a record cannot be sent again: import your "
            "Celery app in your project's __init__.py (from .celery import app as celery_app), as "
            "Celery's Django guide says."
        )
    return app


def publish(stored: Mapping[str, Any], app: Any = None) -> Any:
    """Publish a stored message under its own task id, through its task's own ``apply_async``
    (its routing and defaults) when this process knows the task."""
    app = app or celery_app()
    args, kwargs, sending = _decoded(stored)
    task = app.tasks.get(stored["task"])
    with republishing():
        if task is not None:
            return task.apply_async(args, kwargs, task_id=stored["id"], **sending)
        return app.send_task(stored["task"], args, kwargs, task_id=stored["id"], **sending)


def _send_or_warn(send: Callable[[], Any], label: str, withdraw: Callable[[], Any] | None = None) -> None:
    try:
        send()
    except (BrokerError, OSError) as exc:
        # The record is committed PENDING: the re-drive sends it once the broker is back.
        logger.warning(
            "%s could not be published (%r); its record is PENDING and the re-drive will send it.",
            label,
            exc,
            extra={"idempotency_outcome": "publish_failed"},
        )
    except REFUSED_CALL:
        # Refused for the call itself (an unknown serializer, arguments it cannot encode, bad
        # options): the caller is told the call failed, so no re-drive may send it later. Any other
        # error (a result backend's outage) keeps the record PENDING, for the re-drive.
        if withdraw is not None:
            withdraw()
        raise


#: What a publish raises for the call itself, never for a service that failed: serializing it,
#: its options (``headers="oops"``: ValueError), its arguments against the task (TypeError).
REFUSED_CALL = (SerializationError, SerializerNotInstalled, TypeError, ValueError)


def _after_commit(send: Callable[[], Any], label: str, withdraw: Callable[[], Any] | None = None) -> None:
    """Publish when the caller's transaction commits (at once in autocommit): a rollback sends
    nothing. ``withdraw`` takes the record back when the publish refuses the call itself (REFUSED_CALL)."""
    if store.in_transaction():
        transaction.on_commit(lambda: _send_or_warn(send, label, withdraw), using=store.database())
    else:
        _send_or_warn(send, label, withdraw)


@dataclass(frozen=True)
class Enqueued:
    """What the outbox did with one call: ``sent`` (a new message), else attached or replayed."""

    task_id: str
    sent: bool = False
    replayed: bool = False
    value: Any = None


@dataclass(frozen=True)
class Call:
    """One call of an outbox task, checked by its spec: where and under which key it is recorded."""

    scope: str
    key: str
    task_name: str
    fingerprint: str
    max_attempts: int


def enqueue(call: Call, stored: dict[str, Any], send: Callable[[], Any]) -> Enqueued:
    """Record the call PENDING and publish it after commit, attach to it, or replay it (a call
    carrying the rest of a canvas is published instead); raises IdempotencyKeyMismatch (nothing
    written or sent) for a key used with other arguments."""
    label = f"{call.task_name}[{keys.loggable(call.key)}]"
    record: store.Snapshot | None = store.lookup(call.scope, call.key)
    for _ in range(3):
        if record is None:
            inserted = store.insert_pending(
                call.scope,
                call.key,
                task_name=call.task_name,
                fingerprint=call.fingerprint,
                task_id=stored["id"],
                message=stored,
            )
            if inserted:
                withdraw = functools.partial(store.withdraw_pending, call.scope, call.key, stored["id"])
                _after_commit(send, label, withdraw)
                return Enqueued(stored["id"], sent=True)
            record = store.lookup_latest(call.scope, call.key)  # another caller's INSERT won
            continue
        if record.fingerprint != call.fingerprint:
            raise IdempotencyKeyMismatch(
                f"The idempotency key {keys.loggable(call.key)!r} of {call.task_name!r} was used "
                "before with different arguments. Use a new key for new work."
            )
        if record.status != Status.FAILED and (continues(stored) or store.abandoned(record)):
            # Replaying or attaching here would drop the rest of the canvas, which travels in this
            # message only: published, its delivery replays (or waits for) the key and goes on. A
            # key whose worker died mid-body, its message gone, has nothing on its way to attach
            # to: published, its delivery takes the key over, as a redelivery would.
            _after_commit(send, label)
            return Enqueued(stored["id"], sent=True)
        if record.status == Status.SUCCEEDED:
            return Enqueued(record.task_id, replayed=True, value=record.result)
        if record.status != Status.FAILED:
            return Enqueued(record.task_id)  # PENDING or IN_PROGRESS: already on its way
        if store.is_exhausted(record, call.max_attempts):
            raise AttemptsExhausted(
                f"{label} failed for good after {record.attempts} attempts "
                f"(max_attempts={call.max_attempts}); nothing was sent."
            )
        if store.repend(record, task_id=stored["id"], message=stored):
            _after_commit(send, label)
            return Enqueued(stored["id"], sent=True)
        record = store.lookup_latest(call.scope, call.key)
    raise IdempotencyError(f"{label}: its record kept changing under the caller; nothing was sent.")


def continues(stored: Mapping[str, Any]) -> bool:
    """The stored call carries work that follows it: a chain's rest, callbacks, a chord's body."""
    return any(stored["call"].get(name) is not None for name in CONTINUATIONS)


def replayed_result(enqueued: Enqueued, task_name: str) -> ReplayedResult:
    """The finished result of a key that had already succeeded, holding its stored value."""
    return ReplayedResult(enqueued.task_id, enqueued.value, states.SUCCESS, name=task_name)


# Operators and the re-drive: a stored message sent again.


def _stored(record: IdempotencyRecord, status: str) -> dict[str, Any]:
    if record.status != status:
        raise OutboxError(
            f"{record} is {record.status}, not {status}: "
            + (
                "only a PENDING record is sent again."
                if status == Status.PENDING
                else "only a FAILED record is run again."
            )
        )
    if not isinstance(record.message, dict) or not record.message.get("call"):
        raise OutboxError(f"{record} holds no message to send (it is not a task with outbox=True).")
    return dict(record.message)


class MovedOn(OutboxError):
    """The record is no longer the PENDING record read: a worker claimed it, or it was sent again."""


def send_again(record: IdempotencyRecord) -> str:
    """Publish a PENDING record's stored message again under its own task id; returns the task id."""
    stored = _stored(record, Status.PENDING)
    if not store.still_pending(record.scope, record.key, record.task_id):
        # Read a while ago (the re-drive's listing, an admin page): a record that FAILED since
        # would run again for nobody's asking.
        raise MovedOn(
            f"{record} is no longer PENDING under task id {record.task_id}: it moved on since it was read."
        )
    stored["sent_at"] = _utc_now().isoformat()
    publish(stored)
    store.note_sent(record, stored)
    logger.info(
        "%s[%s] was sent again under its task id %s.",
        record.task_name,
        keys.loggable(record.key),
        stored["id"],
    )
    return str(stored["id"])


def run_again(record: IdempotencyRecord) -> str:
    """Put a FAILED record of an outbox task back to PENDING under a new task id, attempts reset,
    and publish it after commit; returns the new task id."""
    stored = _stored(record, Status.FAILED)
    stored.update(id=uuid(), sent_at=_utc_now().isoformat())
    if not store.repend(record, task_id=stored["id"], message=stored, reset_attempts=True):
        raise OutboxError(f"{record} changed since it was read (another delivery or operator took it).")
    _after_commit(lambda: publish(stored), str(record))
    return str(stored["id"])


def due(stored: Mapping[str, Any], older_than: int, now: datetime.datetime) -> bool:
    """A PENDING message is due for a re-send: ``older_than`` seconds past its send time and its ETA
    (``now`` aware; a naive stored time, as older releases wrote under USE_TZ=False, is read as UTC)."""
    times = [parse_datetime(stored.get(name) or "") for name in ("sent_at", "eta")]
    since = max((_as_utc(time) for time in times if time is not None), default=None)
    return since is None or now >= since + datetime.timedelta(seconds=older_than)


def redrivable(older_than: int, limit: int | None = None) -> list[IdempotencyRecord]:
    """The PENDING records with a message due for a re-send, oldest first (at most ``limit``)."""
    now = timezone.now()  # naive under USE_TZ=False: what the database compares created_at with
    utc_now = _utc_now()
    found: list[IdempotencyRecord] = []
    # created_at bounds the send time from below: only records at least that old can be due.
    candidates = (
        store.records().pending().filter(created_at__lte=now - datetime.timedelta(seconds=older_than))
    )
    for record in candidates.order_by("created_at", "pk").iterator(chunk_size=500):
        if (
            isinstance(record.message, dict)
            and record.message.get("call")
            and due(record.message, older_than, utc_now)
        ):
            found.append(record)
            if limit is not None and len(found) >= limit:
                break
    return found


@dataclass(frozen=True)
class Unsent:
    """A due record the re-drive skipped: its stored call could not be sent (``error`` says why)."""

    record: IdempotencyRecord
    error: Exception


@dataclass
class Redriven:
    """What one re-drive did: the records sent, those it skipped, and the broker error that stopped it."""

    due: int = 0
    sent: list[IdempotencyRecord] = field(default_factory=list)
    unsent: list[Unsent] = field(default_factory=list)
    broker_error: Exception | None = None

    @property
    def left_pending(self) -> int:
        """The due records not sent: skipped, or not tried after the broker refused one."""
        return self.due - len(self.sent)


def redrive(older_than: int, limit: int | None = None) -> Redriven:
    """Send again the PENDING records due for it, oldest first: a record that cannot be sent is
    logged and skipped, a broker error stops the re-drive (the others would fail the same way)."""
    due = redrivable(older_than, limit)
    done = Redriven(due=len(due))
    for record in due:
        try:
            send_again(record)
        except MovedOn:
            continue  # claimed or sent again since the listing: nothing left to send
        except (BrokerError, OSError) as exc:
            logger.warning("%s could not be sent again: %r; the next re-drive tries again.", record, exc)
            done.broker_error = exc
            break
        except Exception as exc:
            # Skipped, or this record (the oldest) would stop every re-drive: a stored call that
            # no longer fits its task after a deploy, an option Celery refuses.
            logger.error(
                "%s could not be sent again and was skipped: %r.",
                record,
                exc,
                exc_info=True,
                extra={"idempotency_outcome": "redrive_failed"},
            )
            done.unsent.append(Unsent(record, exc))
        else:
            done.sent.append(record)
    return done
