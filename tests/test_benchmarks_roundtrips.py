"""The benchmarks count a call's PostgreSQL round trips from libpq's trace, whichever protocol the
driver speaks: the simple one (psycopg's ClientCursor, Django's default) or the extended one (server-side binding,
its prepared statements included)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable

import psycopg
import pytest
from django.db import connection

from benchmarks.roundtrips import RoundTrips, _classify

pytestmark = [
    pytest.mark.bench,
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="libpq's protocol trace"),
]


def traced(client_side: bool, calls: Callable[[psycopg.Connection], None]) -> RoundTrips:
    """What ``calls`` sent on a new autocommit connection to the test database, counted."""
    cursor_factory = psycopg.ClientCursor if client_side else psycopg.Cursor
    # psycopg's own prepare_threshold (Django's default, None, prepares nothing; OPTIONS may set it).
    params = {**connection.get_connection_params(), "cursor_factory": cursor_factory, "prepare_threshold": 5}
    with psycopg.connect(**params, autocommit=True) as raw:
        raw.execute("CREATE TEMPORARY TABLE counted (payload text)")
        counts = RoundTrips()
        with tempfile.TemporaryFile() as trace:
            raw.pgconn.trace(trace.fileno())
            calls(raw)
            raw.pgconn.untrace()
            trace.seek(0)
            _classify(trace.read().decode(errors="replace"), counts)
    return counts


@pytest.mark.parametrize("client_side", [True, False], ids=["simple protocol", "extended protocol"])
def test_reads_writes_and_commits_are_told_apart(client_side: bool) -> None:
    def calls(raw: psycopg.Connection) -> None:
        raw.execute("SELECT payload FROM counted WHERE payload = %s", ["a"]).fetchall()  # a read
        raw.execute("INSERT INTO counted (payload) VALUES (%s)", ["a"])  # autocommit: commits
        with raw.transaction():  # BEGIN, an INSERT that commits nothing yet, COMMIT
            raw.execute("INSERT INTO counted (payload) VALUES (%s)", ["b"])

    counts = traced(client_side, calls)
    assert (counts.reads, counts.commits) == (3, 2)


@pytest.mark.parametrize("client_side", [True, False], ids=["simple protocol", "extended protocol"])
def test_a_statement_run_often_counts_once_per_run(client_side: bool) -> None:
    # psycopg prepares a statement on its sixth run (prepare_threshold 5): with server-side binding
    # that is a round trip of its own (Parse, Sync) that runs nothing, then Binds of the named
    # statement, which carry no text.
    def calls(raw: psycopg.Connection) -> None:
        for n in range(8):
            raw.execute("UPDATE counted SET payload = %s WHERE payload = %s", [str(n), "none"])

    counts = traced(client_side, calls)
    assert counts.commits == 8
    assert counts.reads == (0 if client_side else 1)
