"""W011 (deploy): a records database that streams to standbys without waiting for any of them.

The decision is tested on the rows the live server gives (this machine's PostgreSQL or MariaDB has
no standby) and on the rows a primary with standbys gives: pg_stat_replication.sync_state is
``async``, ``potential``, ``sync`` or ``quorum`` per standby.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import checks as django_checks
from django.db import connection

from django_idempotent_tasks import checks
from tests.helpers import wait_for
from tests.isolation import free_port

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


BIN = Path("/usr/lib/postgresql/15/bin")


def _as_postgres(*command: str) -> list[str]:
    """``command`` as the postgres user: initdb and postgres refuse to run as root."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)


def _sql(port: int, query: str) -> str:
    found = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-At", "-c", query],
        capture_output=True,
        text=True,
        check=True,
    )
    return found.stdout.strip()


@pytest.fixture
def streaming_pair() -> Iterator[int]:
    """A PostgreSQL primary streaming to one standby (initdb, pg_basebackup -R), on free ports,
    stopped by pid; yields the primary's port."""
    primary_port, standby_port = free_port(), free_port()
    root = Path(tempfile.mkdtemp(prefix="idem-clusters-"))  # pytest's tmp_path is root's alone
    os.chmod(root, 0o777)
    primary, standby = root / "primary", root / "standby"
    started: list[Path] = []
    try:
        subprocess.run(
            _as_postgres(str(BIN / "initdb"), "-D", str(primary), "-U", "postgres", "-A", "trust"),
            check=True,
            capture_output=True,
        )
        for data, port in ((primary, primary_port),):
            subprocess.run(
                _as_postgres(
                    str(BIN / "pg_ctl"),
                    "-D",
                    str(data),
                    "-w",
                    "-l",
                    str(data / "log"),
                    "-o",
                    f"-p {port} -k {root} -c listen_addresses=127.0.0.1",
                    "start",
                ),
                check=True,
                capture_output=True,
            )
            started.append(data)
        subprocess.run(
            _as_postgres(
                str(BIN / "pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(primary_port),
                "-U",
                "postgres",
                "-D",
                str(standby),
                "-R",
                "-X",
                "stream",
            ),
            check=True,
            capture_output=True,
        )
        subprocess.run(
            _as_postgres(
                str(BIN / "pg_ctl"),
                "-D",
                str(standby),
                "-w",
                "-l",
                str(standby / "log"),
                "-o",
                f"-p {standby_port} -k {root} -c listen_addresses=127.0.0.1",
                "start",
            ),
            check=True,
            capture_output=True,
        )
        started.append(standby)
        yield primary_port
    finally:
        for data in reversed(started):
            pid = int((data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGINT)  # fast shutdown
            for _ in range(200):
                if not (data / "postmaster.pid").exists():
                    break
                time.sleep(0.05)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(not (BIN / "initdb").exists(), reason="Debian's PostgreSQL 15 server binaries")
def test_a_real_asynchronous_standby_warns_and_a_synchronous_one_does_not(streaming_pair: int) -> None:
    primary_port = streaming_pair
    query = "SELECT sync_state FROM pg_stat_replication"
    settings = (
        "SELECT current_setting('synchronous_standby_names') || '|' || current_setting('synchronous_commit')"
    )

    def problem() -> str | None:
        states = [line for line in _sql(primary_port, query).splitlines() if line]
        names, commit = _sql(primary_port, settings).split("|")
        return checks.postgresql_replication_problem(states, names, commit)

    wait_for(lambda: _sql(primary_port, query), what="the standby to stream")
    assert _sql(primary_port, query) == "async"
    assert "none of them synchronous (sync_state async" in (problem() or "")
    _sql(primary_port, "ALTER SYSTEM SET synchronous_standby_names = '*'")
    _sql(primary_port, "SELECT pg_reload_conf()")
    wait_for(lambda: _sql(primary_port, query) == "sync", what="the standby to become synchronous")
    assert problem() is None
