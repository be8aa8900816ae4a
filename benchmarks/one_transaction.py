"""Probe, on the servers, the one-transaction design of ``atomic=True`` (issue #28, item 5).

    python -m benchmarks.one_transaction [--postgres URL] [--mariadb URL]

The design: claim, body and completion in one transaction; a paused holder's take-over decided by
the server (``SELECT … FOR UPDATE NOWAIT`` on the row, the holder's transaction bounded by a
per-transaction idle timeout); the attempt count of a crash loop kept outside the transaction. Each
probe runs the statements the design would send, on a table of its own (created and dropped), and
prints what the server did. BENCHMARKS.md records the output and the decision.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import urlsplit

TABLE = f"one_transaction_probe_{os.getpid()}"
QUIET = 2.0  # seconds a live body spends without a statement (an HTTP call), against a 1 s bound


def postgres(url: str) -> Callable[[], Any]:
    import psycopg

    return lambda: psycopg.connect(url, autocommit=True)


def mariadb(url: str) -> Callable[[], Any]:
    import MySQLdb

    parts = urlsplit(url)
    options = {"user": parts.username or "root", "host": parts.hostname or "localhost"}
    return lambda: MySQLdb.connect(db=parts.path.lstrip("/"), autocommit=True, **options)


def run(connection: Any, sql: str) -> list[Any]:
    cursor = connection.cursor()
    cursor.execute(sql)
    return list(cursor.fetchall()) if cursor.description else []


def outcome(connection: Any, sql: str) -> str:
    """What ``sql`` did: its rows, or the server's error in one line."""
    try:
        return f"ok {run(connection, sql)}"
    except Exception as exc:  # the point of a probe: any error is the answer
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"


@contextmanager
def probe_table(connect: Callable[[], Any]) -> Iterator[None]:
    setup = connect()
    run(setup, f"CREATE TABLE {TABLE} (id INT PRIMARY KEY, attempts INT NOT NULL)")
    run(setup, f"INSERT INTO {TABLE} VALUES (1, 0)")
    try:
        yield
    finally:
        run(setup, f"DROP TABLE {TABLE}")
        setup.close()


def take(connection: Any) -> str:
    return outcome(connection, f"SELECT id FROM {TABLE} WHERE id = 1 FOR UPDATE NOWAIT")


def quiet_body(connect: Callable[[], Any], bound: list[str]) -> None:
    """A live holder bounded by ``bound``, quiet for QUIET seconds; a contender tries meanwhile."""
    holder, contender = connect(), connect()
    run(holder, "BEGIN")
    for statement in bound:
        print(f"  holder: {statement}: {outcome(holder, statement)}")
    print(f"  holder takes the row: {take(holder)}")
    time.sleep(QUIET / 4)
    print(f"  contender, {QUIET / 4:.1f} s into the holder's quiet body: {take(contender)}")
    time.sleep(QUIET * 3 / 4 + 0.2)
    print(f"  holder's next statement after {QUIET:.0f} s quiet: {outcome(holder, 'SELECT 1')}")
    print(f"  contender after it: {take(contender)}")
    for connection in (holder, contender):
        with suppress(Exception):  # a connection the server ended
            connection.close()


def crash_loop(connect: Callable[[], Any], crashes: int = 3) -> None:
    """Holders that count their attempt inside the transaction and are SIGKILLed in the body."""
    for _ in range(crashes):
        pid = os.fork()
        if pid == 0:
            try:
                holder = connect()
                run(holder, "BEGIN")
                run(holder, f"UPDATE {TABLE} SET attempts = attempts + 1 WHERE id = 1")
                os.kill(os.getpid(), signal.SIGKILL)
            except BaseException:
                traceback.print_exc()
            finally:  # a child that failed never goes on with its parent's code (nor drops its table)
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        if not os.WIFSIGNALED(status):
            raise SystemExit("a crash-loop holder failed before its body (see its traceback above)")
    reader = connect()
    print(
        f"  attempts after {crashes} holders killed in their body: {run(reader, f'SELECT attempts FROM {TABLE}')}"
    )
    reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--mariadb", default="mysql://root@localhost/test")
    options = parser.parse_args()
    bounds = {
        "PostgreSQL": (
            postgres(options.postgres),
            [["SET LOCAL idle_in_transaction_session_timeout = '1s'"]],
        ),
        "MariaDB": (
            mariadb(options.mariadb),
            # Its only per-statement form, then the session's (set before, reset after: 2 more trips).
            [
                ["SET STATEMENT idle_transaction_timeout = 1 FOR SELECT 1"],
                ["SET SESSION idle_transaction_timeout = 1"],
            ],
        ),
    }
    for server, (connect, bound_forms) in bounds.items():
        with probe_table(connect):
            for bound in bound_forms:
                print(f"{server}: a live body quiet for {QUIET:.0f} s, its transaction bounded at 1 s")
                quiet_body(connect, bound)
            print(f"{server}: a crash loop, the attempt counted in the transaction")
            crash_loop(connect)


if __name__ == "__main__":
    main()
