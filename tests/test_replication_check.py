"""W011 (deploy): a records database that streams to standbys without waiting for any of them.

The decision is tested on the rows the live server gives (this machine's PostgreSQL or MariaDB has
no standby) and on the rows a primary with standbys gives: pg_stat_replication.sync_state is
``async``, ``potential``, ``sync`` or ``quorum`` per standby.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks as django_checks
from django.db import connection

from django_idempotent_tasks import checks

ID = "django_idempotent_tasks.W011"


@pytest.mark.django_db
def test_the_live_server_without_standbys_gives_no_warning() -> None:
    found = django_checks.run_checks(include_deployment_checks=True, databases=["default"])
    assert [m for m in found if m.id == ID] == []


def test_it_reads_the_database_only_when_asked() -> None:
    assert checks.check_replication() == []  # no django_db mark: a query would fail the test


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's pg_stat_replication")
def test_the_decision_on_the_live_servers_rows() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT sync_state FROM pg_stat_replication")
        states = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            "SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit')"
        )
        names, commit = cursor.fetchone()
    assert states == []  # this machine's server streams to nobody
    assert checks.postgresql_replication_problem(states, names, commit) is None


@pytest.mark.parametrize(
    ("states", "names", "commit", "warns"),
    [
        (
            ["async"],
            "",
            "on",
            "none of them synchronous (sync_state async; synchronous_standby_names is 'empty')",
        ),
        (["async", "potential"], "FIRST 1 (a, b)", "on", "2 standby(s), none of them synchronous"),
        (["sync"], "a", "on", None),
        (["sync", "async"], "a", "remote_apply", None),
        (["quorum", "quorum"], "ANY 1 (a, b)", "on", None),
        (["sync"], "a", "local", "synchronous_commit=local"),
        (["async"], "", "off", "synchronous_commit=off"),
        ([None], "a", "on", None),  # sync_state hidden without pg_monitor; the standby is named
        ([None], "", "on", "none of them synchronous"),
    ],
)
def test_the_postgresql_decision(states: list[Any], names: str, commit: str, warns: str | None) -> None:
    problem = checks.postgresql_replication_problem(states, names, commit)
    if warns is None:
        assert problem is None
    else:
        assert problem is not None and warns in problem


def test_the_mysql_decision() -> None:
    assert checks.mysql_replication_problem(0, None) is None
    assert checks.mysql_replication_problem(2, "ON") is None
    assert checks.mysql_replication_problem(1, "OFF") == (
        "streams its binary log to 1 replica(s) without semi-synchronous replication"
    )
    assert checks.mysql_replication_problem(1, None) is not None  # no semi-sync plugin at all


@pytest.mark.django_db
def test_the_warning_names_the_database_and_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "postgresql_replication_problem", lambda *args: "streams to 1 standby(s)")
    monkeypatch.setattr(checks, "mysql_replication_problem", lambda *args: "streams to 1 standby(s)")
    found = checks.check_replication(databases=["default"])
    if connection.vendor == "sqlite":
        assert found == []
        return
    assert [m.id for m in found] == [ID]
    assert "'default' that holds the idempotency records streams to 1 standby(s)" in found[0].msg
    assert "synchronous_standby_names" in (found[0].hint or "")
