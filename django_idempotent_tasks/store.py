"""Every read and write of idempotency records on the delivery path: the only place they happen."""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connections,
    router,
    transaction,
)
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from django_idempotent_tasks import deadlines, history, statements
from django_idempotent_tasks.exceptions import IdempotencyConfigurationError
from django_idempotent_tasks.models import DatabaseNow, IdempotencyRecord
from django_idempotent_tasks.values import error_shape

Status = IdempotencyRecord.Status


@dataclass(eq=False)
class Row:
    """A record as the delivery path reads it: one row of one SELECT, its values decoded by their
    fields, without building a model instance (which cost more CPU than the round trip itself)."""

    pk: int
    scope: str
    key: str
    task_name: str
    status: str
    fingerprint: str
    result: Any
    error: dict[str, str] | None
    steps: dict[str, Any]
    attempts: int
    fence: int
    task_id: str
    worker: str
    claim_token: str
    # No timestamps: nothing on the delivery path decides by them (leases are judged in SQL, on the
    # database clock), and decoding them was a tenth of a replay's CPU. The admin reads the model.


#: What the store's functions accept: a Row it read, or a model instance read by the ORM.
Snapshot = Row | IdempotencyRecord


@dataclass(frozen=True)
class Claim:
    """The lease a delivery holds on a record: only writes naming its token succeed."""

    record: Snapshot
    fence: int
    attempt: int
    recovered: bool
    #: Random, new on every claim. Writes name the row by scope, key and token, never by primary
    #: key and fence: a failover that lost a claim can hand both out again (issue #25).
    token: str = ""
    lease_seconds: int = 0


def database() -> str:
    """Alias of the database that holds the records."""
    return router.db_for_write(IdempotencyRecord)


def records() -> Any:
    return IdempotencyRecord.objects.using(database())


def raw_connection() -> Any:
    """The driver connection under the records' database alias (None when closed)."""
    return connections[database()].connection


def connection_works(since: Any) -> bool:
    """Whether the records' connection ``since`` is still the one in use, and still works."""
    connection = connections[database()]
    if connection.vendor == "sqlite":
        return True
    raw = connection.connection
    if raw is None or (since is not None and raw is not since):
        return False  # dropped (Django closes a connection whose rollback failed) or replaced
    if connection.vendor == "postgresql":
        # psycopg knows once a call failed on it; a probe query would fail in an aborted transaction.
        return not (raw.closed or getattr(raw, "broken", False))
    return bool(connection.is_usable())  # MySQL: a ping, harmless inside a transaction


# MySQL/MariaDB error codes of a connection that broke: the client's own (2000-2999: gone away,
# lost during query), and the server's for a connection it ended (shutdown, aborted, killed, idle).
_MYSQL_LOST = (range(2000, 3000), (1053, 1152, 1927, 4031))


def refused_by_server(exc: BaseException) -> bool:
    """``exc`` is the database server's answer to a statement (a timeout, a deadlock, a lock wait),
    not a broken connection: the server was there to refuse it."""
    cause = exc.__cause__
    # The server's SQLSTATE, None client-side: psycopg 3's sqlstate, psycopg2's pgcode.
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if isinstance(sqlstate, str):
        return not sqlstate.startswith(("08", "57P"))  # connection exceptions, the server shutting down
    code = next(iter(getattr(cause, "args", ())), None)  # mysqlclient: (code, message)
    return isinstance(code, int) and not any(code in codes for codes in _MYSQL_LOST)


def stores_jsonb() -> bool:
    """The records' JSON columns are PostgreSQL's jsonb, which reads numbers back as numerics."""
    return bool(connections[database()].vendor == "postgresql")


def json_depth_limit(inside: int = 0) -> int | None:
    """The deepest nesting a value may have ``inside`` levels down a JSON column, or None: no limit.

    MariaDB refuses JSON nested 32 levels or deeper (error 4025), MySQL 101 or deeper.
    """
    connection = connections[database()]
    if connection.vendor != "mysql":
        return None
    return (31 if getattr(connection, "mysql_is_mariadb", False) else 100) - inside


def is_busy(exc: BaseException) -> bool:
    """``exc`` is SQLite's "database is locked": another writer holds the lock; the connection works."""
    return connections[database()].vendor == "sqlite" and "locked" in str(exc)


def lookup(scope: str, key: str) -> Row | None:
    """The record of a scoped key (one indexed SELECT), or None."""
    # Every replay is this one query: a plain cursor and the fields' own converters, no queryset.
    alias = database()
    connection = connections[alias]
    try:
        with connection.cursor() as cursor:
            cursor.execute(statements.select_sql(alias, _ROW_COLUMNS, "scope", "key"), [scope, key])
            values = cursor.fetchone()
    except DatabaseError as exc:
        missing = missing_table_error(alias, exc)
        if missing is None:
            raise
        raise missing from exc
    return None if values is None else Row(*statements.decode(connection, _ROW_COLUMNS, values))


# PostgreSQL: relation "…" does not exist; MySQL/MariaDB: Table '…' doesn't exist; SQLite: no such table.
_MISSING_TABLE = ("does not exist", "doesn't exist", "no such table")


def missing_table_error(alias: str, exc: DatabaseError) -> IdempotencyConfigurationError | None:
    """An error saying to run migrate, when ``exc`` says the records' table is missing; else None."""
    table = IdempotencyRecord._meta.db_table
    message = str(exc)
    if table not in message or not any(phrase in message for phrase in _MISSING_TABLE):
        return None
    command = "python manage.py migrate" + ("" if alias == "default" else f" --database {alias}")
    return IdempotencyConfigurationError(
        f"The idempotency records' table {table} does not exist in the database {alias!r}: "
        f"run `{command}`. The database said: {message.strip()}"
    )


_ROW_COLUMNS = tuple(field.name for field in dataclasses.fields(Row))


def in_transaction() -> bool:
    """The records' connection is in a transaction: an atomic block, or ``set_autocommit(False)``."""
    return not transaction.get_autocommit(database())


def unusable_transaction(autocommit_before: bool) -> str | None:
    """Why the body left the records' connection unable to take its completion, or None.

    An atomic body whose transaction a caught database error broke can commit nothing. A body that
    turned autocommit off and returned would have its completion written into a transaction that
    nobody commits (Celery's Django fix-up closes the connection: a rollback); that transaction is
    rolled back here and autocommit turned back on, so the failure can be recorded.
    """
    connection = connections[database()]
    if connection.in_atomic_block:
        if not connection.needs_rollback:
            return None
        return (
            "The body's transaction was broken by a database error it caught and went on from "
            "(wrap the statement that may fail in its own transaction.atomic()): its writes were "
            "rolled back and its result was not stored."
        )
    if autocommit_before and not connection.get_autocommit():
        connection.rollback()
        connection.set_autocommit(True)
        return (
            "The body turned autocommit off (transaction.set_autocommit(False)) and returned without "
            "turning it back on: its uncommitted writes were rolled back and its result was not stored."
        )
    return None


def _savepoint() -> AbstractContextManager[Any]:
    # Inside a caller's transaction an IntegrityError would poison it: isolate the INSERT.
    # In autocommit mode the INSERT is its own transaction and a savepoint costs two round trips.
    return transaction.atomic(using=database()) if in_transaction() else nullcontext()


def _forget(record: Snapshot, *names: str) -> None:
    # These were written as SQL expressions on the database clock: a model instance forgets the
    # expression objects and loads what the database stored on access (Django's deferred-field load).
    if isinstance(record, IdempotencyRecord):
        for name in names:
            record.__dict__.pop(name, None)


def held_by_another(scope: str, key: str, task_id: str) -> bool:
    """Another delivery holds the key: no record yet (its holder is between lock and claim), or a
    live lease (on the database clock) claimed by another message than ``task_id``.

    A redelivered message carries its task id: a live lease under that id is an earlier delivery of
    the same message, which the broker gave back because its worker died.
    """
    found = records().filter(scope=scope, key=key)
    if not found.exists():
        return True
    live = found.live()
    if task_id:  # an eager call or a function has no message id: any live lease is another's
        live = live.exclude(task_id=task_id)
    return bool(live.exists())


def insert(
    scope: str,
    key: str,
    *,
    task_name: str,
    fingerprint: str,
    task_id: str,
    worker: str,
    lease_seconds: int,
    record_ttl: int,
) -> Claim | None:
    """Create the record IN_PROGRESS with fence 1; None if another delivery created it first."""
    alias = database()
    connection = connections[alias]
    token = new_token()
    row = Row(
        0,
        scope,
        key,
        task_name,
        Status.IN_PROGRESS,
        fingerprint,
        None,
        None,
        {},
        1,
        1,
        task_id,
        worker,
        token,
    )
    sql, returning = insert_sql(alias)
    now = statements.prepare(connection, "created_at", timezone.now())
    params = [*(getattr(row, name) for name in _CLAIMED), now, now]  # text: nothing to prepare
    claimed = _claimed_event(fence=1, attempt=1, worker=worker, task_id=task_id)
    try:
        with _within_bound(connection, sql, isolated=True) as sql, connection.cursor() as cursor:
            cursor.execute(sql, [*params, lease_seconds, record_ttl, *claimed.values()])
            table, pk = IdempotencyRecord._meta.db_table, statements.column("pk")
            row.pk = cursor.fetchone()[0] if returning else connection.ops.last_insert_id(cursor, table, pk)
    except IntegrityError:
        return None
    return Claim(record=row, fence=1, attempt=1, recovered=False, token=token, lease_seconds=lease_seconds)


# What insert() writes: the claim's own values, the timestamps (now), the columns every claim
# starts with (constants in the statement), then the lease and the retention (on the database clock).
_CLAIMED = ("scope", "key", "task_name", "fingerprint", "task_id", "worker", "claim_token")
_STAMPED = ("created_at", "started_at")
_FRESH = (
    ("status", Status.IN_PROGRESS.value),
    ("result", None),
    ("error", None),
    ("steps", "{}"),  # the JSON text of an empty object
    ("attempts", 1),
    ("fence", 1),
)
_CLOCKED = ("lease_expires_at", "expires_at")
assert {*_CLAIMED, *(name for name, _ in _FRESH)} == set(_ROW_COLUMNS[1:]), "insert() writes every column"


def insert_sql(alias: str) -> tuple[str, bool]:
    """The claim's INSERT on ``alias``, and whether it returns the new primary key (RETURNING)."""
    return statements.insert_sql(alias, (*_CLAIMED, *_STAMPED), _CLOCKED, _CLAIMED_EVENT, _FRESH)


def _claimed_event(**fields: str | int) -> dict[str, str | int]:
    """The attempts log's event of a claim (its time is the database clock's)."""
    return {"event": "claimed", **fields}


_CLAIMED_EVENT = tuple(_claimed_event(fence=0, attempt=0, worker="", task_id=""))


def take_over(
    record: Snapshot, *, task_id: str, worker: str, lease_seconds: int, record_ttl: int
) -> Claim | None:
    """Claim a FAILED or PENDING record, or one whose lease expired on the database clock; None if
    it is no longer as it was read."""
    fence, attempt, token = record.fence + 1, record.attempts + 1, new_token()
    changes: dict[str, Any] = {
        "status": Status.IN_PROGRESS,
        "fence": fence,
        "claim_token": token,
        "attempts": attempt,
        "task_id": task_id,
        "worker": worker,
        "started_at": timezone.now(),
        "completed_at": None,
        "lease_expires_at": DatabaseNow(lease_seconds),
        "expires_at": DatabaseNow(record_ttl),
    }
    claimed = _claimed_event(fence=fence, attempt=attempt, worker=worker, task_id=task_id)
    recovered = record.status == Status.IN_PROGRESS
    if not (
        _take_over_stuck(record, changes, claimed)
        if recovered
        else _take_over_waiting(record, changes, claimed)
    ):
        return None
    for name, value in changes.items():
        if isinstance(record, IdempotencyRecord) or name in _ROW_COLUMNS:
            setattr(record, name, value)
    _forget(record, *_CLOCKED)
    if recovered:
        # The steps are read again under the claim: the holder whose lease expired may have
        # checkpointed one since the copy read before the lock. (Only an IN_PROGRESS holder can
        # write steps: a FAILED or PENDING record's copy is current, the fence and token say so.)
        record.steps = _steps(record.scope, record.key)
    return Claim(
        record=record,
        fence=fence,
        attempt=attempt,
        recovered=recovered,
        token=token,
        lease_seconds=lease_seconds,
    )


def _take_over_stuck(record: Snapshot, changes: dict[str, Any], claimed: dict[str, Any]) -> bool:
    """Claim an IN_PROGRESS record whose lease expired (judged in SQL, on the database clock)."""
    with _within_bound(connections[database()]):
        return bool(_named(record).claimable().update(**changes, attempts_log=history.AppendEvent(**claimed)))


def _take_over_waiting(record: Snapshot, changes: dict[str, Any], claimed: dict[str, Any]) -> bool:
    """Claim a FAILED or PENDING record, still as it was read: one precompiled statement, as the
    claim of a new key is (an outbox task's first delivery claims its PENDING record this way)."""
    later = {name: changes[name].seconds for name in _CLOCKED}
    values = {name: value for name, value in changes.items() if name not in later}
    named = (record.scope, record.key, record.fence, record.claim_token, record.status)
    return _update_named(named, later, claimed, **values)


def new_token() -> str:
    """A random claim token."""
    return secrets.token_hex(16)


def _named(record: Snapshot) -> Any:
    """The record as it was read: by scope and key, at the fence and token read (a compare-and-set)."""
    return records().filter(
        scope=record.scope, key=record.key, fence=record.fence, claim_token=record.claim_token
    )


def _steps(scope: str, key: str) -> dict[str, Any]:
    alias = database()
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(statements.select_sql(alias, ("steps",), "scope", "key"), [scope, key])
        found = cursor.fetchone()
    return {} if found is None else dict(statements.decode(connection, ("steps",), found)[0] or {})


# The bound set by bounded() for the lease's writes made in this thread, in seconds.
_bound: ContextVar[tuple[float, bool] | None] = ContextVar("idempotency_statement_bound", default=None)


@contextlib.contextmanager
def bounded(seconds: float, *, client_only: bool = False) -> Iterator[None]:
    """The lease's calls made inside end within about ``seconds``: the database cancels a statement
    (a row lock), and past ``deadlines.GRACE`` more the client cuts the connection (a peer that
    stopped answering behind a live TCP link; a COMMIT waiting for a synchronous standby, which
    PostgreSQL's statement_timeout does not cover).

    ``client_only``: on PostgreSQL, only the client's cut, no statement_timeout: the claim and the
    completion's first write, on every first execution's path, where the server-side bound's own
    transaction (BEGIN, set_config, COMMIT) tripled the round trips. A write sent again, and a
    renewal, keep both: the server ends a row-lock wait with an error and the connection lives."""
    token = _bound.set((max(seconds, 0.1), client_only))
    try:
        yield
    finally:
        _bound.reset(token)


@contextlib.contextmanager
def _within_bound(connection: Any, sql: str = "", *, isolated: bool = False) -> Iterator[str]:
    """``sql`` as sent under the current bound: per statement, so a pooler in transaction mode
    (PgBouncer) never carries the timeout over to another client. Whatever else runs inside (the
    PostgreSQL transaction's COMMIT included) is under the bound too. ``isolated``: inside a
    caller's transaction, in a savepoint (an error must not poison that transaction)."""
    bound = _bound.get()
    if bound is None or connection.vendor == "sqlite":  # SQLite: its busy timeout, and hole 6's retry
        with _savepoint() if isolated else nullcontext():
            yield sql
        return
    seconds, client_only = bound
    connection.ensure_connection()  # opening it is bounded by the driver's connect timeout
    with deadlines.cut_after(connection.connection.fileno(), seconds + deadlines.GRACE):
        if connection.vendor == "mysql":
            # MariaDB: a prefix on the statement itself, no extra round trip. (MySQL has no such
            # prefix for an UPDATE: its writes stay bound by innodb_lock_wait_timeout.)
            with _savepoint() if isolated else nullcontext():
                yield (
                    f"SET STATEMENT max_statement_time={seconds:.3f} FOR {sql}"
                    if connection.mysql_is_mariadb and sql
                    else sql
                )
            return
        if client_only:
            with _savepoint() if isolated else nullcontext(), _closed_if_cut(connection):
                yield sql
            return
        # PostgreSQL: SET LOCAL lasts until the end of the statement's own transaction. Costs a
        # transaction of its own (BEGIN, set_config, COMMIT) when none is open; inside one, this
        # block is the savepoint that isolates the statement.
        milliseconds = str(int(seconds * 1000))
        with transaction.atomic(using=connection.alias):
            try:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true)",
                        [milliseconds, milliseconds],
                    )
            except DatabaseError as exc:
                # BEGIN and set_config fail only on a connection that cannot be trusted (a pooler's
                # server terminated under the BEGIN: psycopg's "received 2 results"): a lost one.
                connection.close()
                if isinstance(exc, (OperationalError, InterfaceError)):
                    raise
                raise OperationalError(str(exc)) from exc
            with _closed_if_cut(connection):
                yield sql


@contextlib.contextmanager
def _closed_if_cut(connection: Any) -> Iterator[None]:
    try:
        yield
    except DatabaseError:
        if not connection_works(since=None):
            # Cut (or dropped): closed inside the block, Django forgets it instead of connecting
            # again, unbounded, to turn autocommit back on.
            connection.close()
        raise


def _update_held(
    claim: Claim,
    later: dict[str, int] | None = None,
    event: dict[str, Any] | None = None,
    isolated: bool = False,
    **values: Any,
) -> bool:
    """``UPDATE … WHERE scope, key, fence and claim_token = mine AND status = IN_PROGRESS``; False if
    the key was claimed again since (or is no longer IN_PROGRESS).

    ``later`` sets columns to the database clock plus so many seconds; ``event`` is appended to the
    attempts log.
    """
    named = (claim.record.scope, claim.record.key, claim.fence, claim.token, Status.IN_PROGRESS)
    return _update_named(named, later, event, isolated, **values)


def _update_named(
    named: tuple[str, str, int, str, str],
    later: dict[str, int] | None = None,
    event: dict[str, Any] | None = None,
    isolated: bool = False,
    **values: Any,
) -> bool:
    """``UPDATE … WHERE scope, key, fence, claim_token and status`` are ``named``; False if the row
    moved on (a compare-and-set).

    One precompiled statement per set of columns: building the ORM's UPDATE cost more CPU than its
    round trip (see BENCHMARKS.md). Values are prepared by their fields, as the ORM would.
    """
    alias = database()
    connection = connections[alias]
    params = [statements.prepare(connection, name, value) for name, value in values.items()]
    later, event = later or {}, event or {}
    sql = statements.update_held_sql(alias, tuple(values), tuple(later), tuple(event))
    with _within_bound(connection, sql, isolated=isolated) as sql, connection.cursor() as cursor:
        cursor.execute(
            sql,
            [
                *params,
                *later.values(),
                *event.values(),
                *named,
            ],
        )
        return bool(cursor.rowcount == 1)


def renew(claim: Claim, lease_seconds: int) -> bool:
    """Extend the lease to the database clock plus ``lease_seconds``; False if the fence moved on."""
    return _update_held(claim, {"lease_expires_at": lease_seconds})


def checkpoint(claim: Claim, steps: dict[str, Any]) -> bool:
    """Store the steps finished so far; False if the fence moved on."""
    return _update_held(claim, steps=steps)


def complete(claim: Claim, result: Any, error: dict[str, str] | None, record_ttl: int) -> bool:
    """Mark the key SUCCEEDED with its result; False if the fence moved on."""
    # Isolated: in an atomic body, a refused value must not poison its transaction. (Its savepoint
    # is made under the bound: a SAVEPOINT to a silent peer would hang as long as the UPDATE.)
    written = _update_held(
        claim,
        status=Status.SUCCEEDED,
        result=result,
        error=error,
        message=None,  # an outbox task's call is kept only while PENDING or FAILED
        completed_at=timezone.now(),
        lease_expires_at=None,
        later={"expires_at": record_ttl},
        event={"event": "completed", "fence": claim.fence},
        isolated=True,
    )
    return written or landed(claim, Status.SUCCEEDED)


def landed(claim: Claim, status: str, error_type: str | None = None) -> bool:
    """The record is in ``status`` under this very claim: a write of ours whose reply was lost landed.

    A fenced write sent again after an ambiguous commit matches nothing (its first copy moved the
    record on): read the record at our own token before calling that a lost lease (issue #25).
    """
    alias = database()
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(
            statements.select_sql(alias, ("status", "error"), "scope", "key", "fence", "claim_token"),
            [claim.record.scope, claim.record.key, claim.fence, claim.token],
        )
        found = cursor.fetchone()
    if found is None:
        return False
    found_status, error = statements.decode(connection, ("status", "error"), found)
    return bool(found_status == status and (error_type is None or (error or {}).get("type") == error_type))


def committed(claim: Claim) -> bool:
    """Whether the completion of ``claim`` committed, read on a fresh connection after its COMMIT's
    reply was lost; False when that cannot be read either."""
    connection = connections[database()]
    with contextlib.suppress(DatabaseError):
        connection.close()
    try:
        return landed(claim, Status.SUCCEEDED)
    except DatabaseError:
        return False


def _mark_failed(
    held: Any,
    error: dict[str, str],
    *,
    at_least_attempts: int | None = None,
    event: dict[str, str | int] | None = None,
) -> bool:
    """The one FAILED transition: the lease ends, the error is stored, ``event`` ends the holder's
    attempt in the attempts log; False if nothing matched."""
    changes: dict[str, Any] = {
        "status": Status.FAILED,
        "error": error,
        "lease_expires_at": None,
        "completed_at": timezone.now(),
    }
    if at_least_attempts is not None:  # failed for good: no later delivery may claim it again
        changes["attempts"] = Greatest(F("attempts"), Value(at_least_attempts))
    if event is not None:
        changes["attempts_log"] = history.AppendEvent(**event)
    return bool(held.update(**changes))


def _held(claim: Claim) -> Any:
    return records().filter(
        scope=claim.record.scope,
        key=claim.record.key,
        fence=claim.fence,
        claim_token=claim.token,
        status=Status.IN_PROGRESS,
    )


def fail(claim: Claim, error: dict[str, str], *, for_good_after: int | None = None) -> bool:
    """Mark the key FAILED (retryable, or for good with ``for_good_after``); False if the fence moved on."""
    ended: dict[str, str | int] = {"event": "failed", "fence": claim.fence, "detail": error["type"]}
    with _within_bound(connections[database()]):
        written = _mark_failed(_held(claim), error, at_least_attempts=for_good_after, event=ended)
    return written or landed(claim, Status.FAILED, error["type"])


def exhaust(record: Snapshot, max_attempts: int) -> bool:
    """Fail a key for good (it used up ``max_attempts`` claims); False if a live holder has it."""
    last = record.error or {}
    message = f"{record.attempts} attempts used, max_attempts is {max_attempts}."
    if last.get("type") and last.get("type") != "AttemptsExhausted":
        message += f" Last error: {last['type']}: {last.get('message', '')}"
    error = error_shape("AttemptsExhausted", message)
    if not _mark_failed(_named(record).claimable(), error):
        return bool(
            record.status == Status.FAILED and (record.error or {}).get("type") == "AttemptsExhausted"
        )
    record.status, record.error = Status.FAILED, error
    return True


def is_exhausted(record: Snapshot, max_attempts: int) -> bool:
    """The key cannot be claimed again."""
    return record.status != Status.SUCCEEDED and record.attempts >= max_attempts


def release_lease(record: IdempotencyRecord, by: str, *, force: bool = False) -> bool:
    """Mark an IN_PROGRESS record FAILED so the next delivery reruns it; live leases need force."""
    held = _named(record).filter(status=Status.IN_PROGRESS)
    if not force:
        held = held.not_live()
    return _mark_failed(
        held,
        error_shape("LeaseReleased", f"Lease released by {by} at {timezone.now().isoformat()}."),
        event={"event": "released", "fence": record.fence, "detail": f"by {by}"},
    )


def fail_task(scope: str, key: str, task_id: str, error: dict[str, str], worker: str | None = None) -> bool:
    """Mark the key FAILED if the delivery ``task_id`` (in process ``worker``) still holds it: it was killed."""
    held = records().filter(scope=scope, key=key, task_id=task_id, status=Status.IN_PROGRESS)
    # A redelivery of the same message carries the same task id: the killed child's pid tells them apart.
    record = (held if worker is None else held.filter(worker=worker)).first()
    if record is None:
        return False
    died: dict[str, str | int] = {"event": "died", "fence": record.fence, "detail": error["type"]}
    # By claim token: if another delivery took the key over since, this write matches nothing.
    return _mark_failed(_named(record).filter(status=Status.IN_PROGRESS), error, event=died)


def note_lease_lost(claim: Claim) -> None:
    """Add to the attempts log that the holder of ``claim`` heard it lost its lease."""
    # Its own round trip, on a rare path: the refused write that told it matched no row to append to.
    lost = history.AppendEvent(event="lease_lost", fence=claim.fence)
    # Named by scope and key, never by primary key (a failover can hand a primary key out again).
    # The history is a courtesy to the operator: never let it turn a lost lease into another error.
    with contextlib.suppress(DatabaseError), _savepoint():
        records().filter(scope=claim.record.scope, key=claim.record.key).update(attempts_log=lost)


# The outbox (caller side): a PENDING record holds the message that publishes the call again.


def insert_pending(
    scope: str, key: str, *, task_name: str, fingerprint: str, task_id: str, message: dict[str, Any]
) -> bool:
    """Create the record PENDING (fence 0, no attempt yet); False if another caller created it first."""
    record = IdempotencyRecord(
        scope=scope,
        key=key,
        task_name=task_name,
        status=Status.PENDING,
        fingerprint=fingerprint,
        attempts=0,
        fence=0,
        claim_token=new_token(),
        task_id=task_id,
        message=message,
    )
    try:
        with _savepoint():
            record.save(using=database(), force_insert=True)
    except IntegrityError:
        return False
    return True


def _pending_under(scope: str, key: str, task_id: str) -> Any:
    """The record of a scoped key while it is PENDING under the message ``task_id``."""
    return records().filter(scope=scope, key=key, task_id=task_id, status=Status.PENDING)


def fail_pending(scope: str, key: str, task_id: str, error: dict[str, str]) -> bool:
    """Mark FAILED the PENDING record whose message ``task_id`` a worker discarded unrun (revoked or
    expired); False if the key has moved on (claimed, sent again under another id)."""
    return _mark_failed(_pending_under(scope, key, task_id), error)  # no attempt to end: none began


def still_pending(scope: str, key: str, task_id: str) -> bool:
    """The record of a scoped key is PENDING under ``task_id``, as last committed."""
    return bool(_pending_under(scope, key, task_id).exists())


def withdraw_pending(scope: str, key: str, task_id: str) -> None:
    """Delete the PENDING record a call wrote under ``task_id``, if it is still that record."""
    _pending_under(scope, key, task_id).delete()


def abandoned(record: Snapshot) -> bool:
    """An IN_PROGRESS record whose holder's lease has expired (on the database clock): its worker died,
    and nothing runs it until a delivery takes it over."""
    if record.status != Status.IN_PROGRESS:
        return False
    return bool(records().filter(scope=record.scope, key=record.key).stuck().exists())


def lookup_latest(scope: str, key: str) -> Snapshot | None:
    """The record as last committed, even inside a caller's transaction on MySQL (whose repeatable
    read would show the snapshot taken before a concurrent INSERT committed)."""
    if in_transaction() and connections[database()].vendor == "mysql":
        return records().select_for_update().filter(scope=scope, key=key).first()  # type: ignore[no-any-return]
    return lookup(scope, key)


def repend(record: Snapshot, *, task_id: str, message: dict[str, Any], reset_attempts: bool = False) -> bool:
    """Put a FAILED record back to PENDING under ``task_id`` (a compare-and-set on its claim token);
    False if it is no longer the FAILED record read."""
    changes: dict[str, Any] = {
        "status": Status.PENDING,
        "task_id": task_id,
        "message": message,
        "lease_expires_at": None,
        "expires_at": None,
        "claim_token": new_token(),
    }
    if reset_attempts:
        changes["attempts"] = 0
    return bool(_named(record).filter(status=Status.FAILED).update(**changes))


def note_sent(record: Snapshot, message: dict[str, Any]) -> bool:
    """Store the message of a PENDING record as sent again (its new send time); False if it moved on."""
    pending = records().filter(scope=record.scope, key=record.key, status=Status.PENDING)
    return bool(pending.filter(task_id=record.task_id).update(message=message))
