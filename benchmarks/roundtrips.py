"""Count the real round trips of one call: PostgreSQL protocol messages and Redis commands."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from django_idempotent_tasks.locks import lock_client


@dataclass
class RoundTrips:
    """What one call sent: SQL statements, PostgreSQL round trips by kind, Redis commands."""

    statements: int = 0
    reads: int = 0  # round trips that commit nothing: SELECT, BEGIN, a write inside a transaction
    commits: int = 0  # round trips that commit: COMMIT, or a write in autocommit mode
    redis: list[str] = field(default_factory=list)

    @property
    def database(self) -> int:
        return self.reads + self.commits

    def describe(self) -> str:
        return f"{self.database} PG ({self.commits} commit) + {len(self.redis)} Redis" + (
            f" ({', '.join(self.redis)})" if self.redis else ""
        )


def _classify(trace: str, counts: RoundTrips) -> None:
    # libpq's trace: a frontend "Query" is one round trip, answered by "ReadyForQuery I|T|E";
    # status I after a write means that the write committed (autocommit or COMMIT).
    pending: str | None = None
    for line in trace.splitlines():
        parts = line.split("\t")
        if len(parts) < 5:
            continue
        direction, message, content = parts[1], parts[3], parts[4].strip(' "')
        if direction == "F" and message == "Query":
            pending = content.split(None, 1)[0].upper()
        elif direction == "B" and message == "ReadyForQuery" and pending is not None:
            committed = content == "I"
            writes = pending in {"INSERT", "UPDATE", "DELETE", "COMMIT"}
            if writes and committed:
                counts.commits += 1
            else:
                counts.reads += 1
            pending = None


@contextmanager
def counting() -> Iterator[RoundTrips]:
    """Count what the block sends to PostgreSQL (protocol trace) and to the lock Redis."""
    counts = RoundTrips()
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    client = lock_client()
    original: Callable[..., Any] = client.execute_command

    def execute_command(*args: Any, **options: Any) -> Any:
        counts.redis.append(str(args[0]))
        return original(*args, **options)

    def execute(run: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        counts.statements += 1
        return run(sql, params, many, context)

    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        client.execute_command = execute_command
        try:
            with connection.execute_wrapper(execute):
                yield counts
        finally:
            del client.execute_command
            pgconn.untrace()
        trace.seek(0)
        _classify(trace.read().decode(errors="replace"), counts)
