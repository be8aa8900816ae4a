"""Count the real round trips of one call: PostgreSQL protocol messages (or MariaDB's client
calls) and Redis commands."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from django_idempotent_tasks.locks import lock_client


@dataclass
class RoundTrips:
    """What one call sent: SQL statements, database round trips by kind, Redis commands."""

    statements: int = 0
    reads: int = 0  # round trips that commit nothing: SELECT, BEGIN, a write inside a transaction
    commits: int = 0  # round trips that commit: COMMIT, or a write in autocommit mode
    redis: list[str] = field(default_factory=list)
    server: str = "PG"

    @property
    def database(self) -> int:
        return self.reads + self.commits

    def describe(self) -> str:
        return f"{self.database} {self.server} ({self.commits} commit) + {len(self.redis)} Redis" + (
            f" ({', '.join(self.redis)})" if self.redis else ""
        )


# The extended protocol (psycopg's server-side binding): Parse names a statement and carries its
# text, Bind runs a named (or the unnamed) statement, Sync ends the round trip.
_PARSE = re.compile(r'^\s*"([^"]*)"\s+"\s*(\S+)')
_BIND = re.compile(r'^\s*"[^"]*"\s+"([^"]*)"')


def _classify(trace: str, counts: RoundTrips) -> None:
    # libpq's trace: each round trip ends with the backend's "ReadyForQuery I|T|E"; status I after
    # a write means that the write committed (autocommit or COMMIT). The round trip's verb is its
    # "Query" message's first word (the simple protocol, psycopg's default ClientCursor), or that of
    # the statement its "Bind" runs; a round trip that only parses (psycopg preparing a statement
    # it has run often) runs nothing, and counts as a read.
    prepared: dict[str, str] = {}
    pending: str | None = None
    for line in trace.splitlines():
        parts = line.split("\t")
        if len(parts) < 4:
            continue
        direction, message, content = parts[1], parts[3], (parts[4] if len(parts) > 4 else "")
        if direction == "F" and message == "Query":
            pending = content.strip(' "').split(None, 1)[0].upper()
        elif direction == "F" and message == "Parse" and (parsed := _PARSE.match(content)):
            prepared[parsed[1]] = parsed[2].upper()
            pending = pending or "PARSE"
        elif direction == "F" and message == "Bind" and (bound := _BIND.match(content)):
            pending = prepared.get(bound[1], "UNKNOWN")
        elif direction == "B" and message == "ReadyForQuery" and pending is not None:
            committed = content.strip() == "I"
            writes = pending in {"INSERT", "UPDATE", "DELETE", "COMMIT"}
            if writes and committed:
                counts.commits += 1
            else:
                counts.reads += 1
            pending = None


@contextmanager
def counting() -> Iterator[RoundTrips]:
    """Count what the block sends to the database (PostgreSQL's protocol trace, or the MariaDB
    client's calls) and to the lock Redis."""
    counts = RoundTrips()
    connection.ensure_connection()
    client = lock_client()
    original: Callable[..., Any] = client.execute_command

    def execute_command(*args: Any, **options: Any) -> Any:
        counts.redis.append(str(args[0]))
        return original(*args, **options)

    def execute(run: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        counts.statements += 1
        return run(sql, params, many, context)

    tracing = _mysql_calls if connection.vendor == "mysql" else _postgresql_trace
    with tracing(counts):
        client.execute_command = execute_command
        try:
            with connection.execute_wrapper(execute):
                yield counts
        finally:
            del client.execute_command


@contextmanager
def _postgresql_trace(counts: RoundTrips) -> Iterator[None]:
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        try:
            yield
        finally:
            pgconn.untrace()
        trace.seek(0)
        _classify(trace.read().decode(errors="replace"), counts)


_WRITES = {"INSERT", "UPDATE", "DELETE", "REPLACE"}
# A bounded write on MariaDB: SET STATEMENT max_statement_time=N FOR <the statement>.
_SET_STATEMENT = re.compile(r"^\s*SET\s+STATEMENT\s+.*?\s+FOR\s+", re.IGNORECASE | re.DOTALL)


def _verb(sql: str) -> str:
    """The statement's first word, past MariaDB's SET STATEMENT … FOR prefix."""
    return _SET_STATEMENT.sub("", sql, count=1).split(None, 1)[0].upper()


_CALLS = ("query", "commit", "rollback", "autocommit", "ping")


@contextmanager
def _mysql_calls(counts: RoundTrips) -> Iterator[None]:
    # No protocol trace in mysqlclient: its cursors send every statement through Connection.query,
    # and the transaction commands each through their own call, each call one round trip. The
    # instance attributes shadow the class's methods until popped (the connection refuses del).
    raw = connection.connection
    counts.server = connection.display_name
    query, commit, rollback = raw.query, raw.commit, raw.rollback
    autocommit, ping = raw.autocommit, raw.ping

    def counted_query(sql: bytes | str) -> None:
        verb = _verb(sql.decode(errors="replace") if isinstance(sql, bytes) else sql)
        # In autocommit mode a write is its own transaction: it commits, as on PostgreSQL.
        if verb == "COMMIT" or (verb in _WRITES and raw.get_autocommit()):
            counts.commits += 1
        else:
            counts.reads += 1
        query(sql)

    def counted_commit() -> None:
        counts.commits += 1
        commit()

    def counted_read(call: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            counts.reads += 1
            return call(*args)

        return counted

    def counted_autocommit(on: bool) -> None:
        before = raw.get_autocommit()
        autocommit(on)
        # mysqlclient sends SET autocommit only when the mode changes, and the server's reply
        # carries the new mode.
        if raw.get_autocommit() != before:
            counts.reads += 1

    shadowed = {name: vars(raw)[name] for name in _CALLS if name in vars(raw)}  # an outer counting()
    raw.query, raw.commit, raw.autocommit = counted_query, counted_commit, counted_autocommit
    raw.rollback, raw.ping = counted_read(rollback), counted_read(ping)
    try:
        yield
    finally:
        for name in _CALLS:
            vars(raw).pop(name)
        vars(raw).update(shadowed)
