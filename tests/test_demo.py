"""``manage.py demo`` of the example project, run as a subprocess with real workers and SQLite."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.helpers import ROOT, wait_for

pytestmark = pytest.mark.workers

MANAGE = ROOT / "example_project" / "manage.py"
DEMO_REDIS_DB = 5  # the demo uses databases 5 (broker), 6 (locks) and 7 (results) of REDIS_URL
# Bounds a stop (the workers' warm shutdown, then SIGKILL), far above what it takes on a busy machine.
STOP_TIMEOUT = 90
ROW = re.compile(r"^(\d)\s{2,}(.+?)\s{2,}(\d+) / (\d+)\s+(\d+)\s+(\d+)\s+(\d+)$")


@dataclass(frozen=True)
class Row:
    scenario: int
    title: str
    deliveries_plain: int
    deliveries_idempotent: int
    charges_plain: int
    charges_idempotent: int
    replays: int


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str

    @property
    def rows(self) -> dict[int, Row]:
        found = {}
        for line in self.output.splitlines():
            match = ROW.match(line.strip())
            if match:
                number, title, *counts = match.groups()
                found[int(number)] = Row(int(number), title, *(int(c) for c in counts))
        return found


def demo_env(tmp_path: Path, migrate: bool = True) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    env.update(
        REDIS_URL=f"{settings.REDIS_URL}/{DEMO_REDIS_DB}",
        DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        PYTHONUNBUFFERED="1",
        # Under `make pytest`, the demo's processes (working in example_project/) report their
        # coverage next to the suite's own data files, which `coverage combine` picks up.
        COVERAGE_FILE=str(ROOT / ".coverage"),
    )
    for offset in range(3):
        redis.Redis.from_url(f"{settings.REDIS_URL}/{DEMO_REDIS_DB + offset}").flushdb()
    if migrate:
        subprocess.run([sys.executable, MANAGE, "migrate", "-v", "0"], env=env, check=True, timeout=120)
    return env


def run_demo(tmp_path: Path, *args: str) -> Run:
    env = demo_env(tmp_path)
    done = subprocess.run(
        [sys.executable, MANAGE, "demo", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert not processes_using(env["DATABASE_URL"]), "the demo left processes behind"
    return Run(done.returncode, done.stdout + done.stderr)


def processes_using(database_url: str) -> list[int]:
    """Processes whose environment names this test's database: the demo and its workers."""
    marker = f"DATABASE_URL={database_url}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue  # gone, or not ours to read
    return found


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield run_demo(tmp_path_factory.mktemp("demo"))


@pytest.mark.timeout(420)
def test_the_whole_demo_succeeds_and_prints_every_scenario(whole_run: Run) -> None:
    assert whole_run.returncode == 0, whole_run.output
    assert sorted(whole_run.rows) == [1, 2, 3, 4, 5, 6], whole_run.output
    assert "The idempotent task charged exactly once per key in every scenario." in whole_run.output
    assert "The gateway deduplicated 0 requests of the idempotent task" in whole_run.output


# Lower bounds only: on a loaded machine a short visibility timeout may add a redelivery anywhere.
@pytest.mark.parametrize(
    ("scenario", "plain_charges", "idempotent_deliveries", "replays"),
    [(1, 2, 2, 1), (2, 2, 2, 0), (3, 3, 3, 0), (4, 2, 2, 1), (5, 2, 2, 1), (6, 20, 20, 19)],
)
def test_each_scenario_duplicates_the_plain_charge_and_absorbs_the_idempotent_one(
    whole_run: Run, scenario: int, plain_charges: int, idempotent_deliveries: int, replays: int
) -> None:
    row = whole_run.rows[scenario]
    assert row.charges_idempotent == 1, whole_run.output
    assert row.charges_plain >= plain_charges, whole_run.output
    assert row.deliveries_plain >= row.charges_plain, whole_run.output
    assert row.deliveries_idempotent >= idempotent_deliveries, whole_run.output
    assert row.replays >= replays, whole_run.output


@pytest.mark.timeout(300)
def test_one_scenario_runs_alone(tmp_path: Path) -> None:
    run = run_demo(tmp_path, "--scenario", "3")
    assert run.returncode == 0, run.output
    assert list(run.rows) == [3], run.output
    assert run.rows[3].charges_plain >= 3, run.output
    assert run.rows[3].charges_idempotent == 1, run.output
    assert "[3/6] retry after partial success" in run.output


@pytest.mark.timeout(300)
def _as_a_background_job() -> None:
    # A non-interactive shell starts `command &` with SIGINT ignored, and exec keeps that: the way
    # `make test &` or a CI script starts the suite, and so the demo under it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("parent", ["terminal", "background job"])
def test_ctrl_c_stops_the_demo_and_its_workers(tmp_path: Path, parent: str) -> None:
    env = demo_env(tmp_path)
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = subprocess.Popen(
            [sys.executable, MANAGE, "demo"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_as_a_background_job if parent == "background job" else None,
        )
        try:
            wait_for(
                lambda: "[1/6]" in log.read_text(), timeout=120, what="the demo to start its first scenario"
            )
            demo.send_signal(signal.SIGINT)  # once: a second Ctrl-C must not be needed
            returncode = demo.wait(timeout=STOP_TIMEOUT)
        finally:
            if demo.poll() is None:
                demo.kill()
    assert returncode == 130, log.read_text()
    assert "Interrupted; the demo's workers were stopped." in log.read_text()
    assert "[2/6]" not in log.read_text(), "the demo ran on after SIGINT"
    assert not processes_using(env["DATABASE_URL"]), "the demo left processes behind"


def test_the_example_project_migrations_are_in_sync(tmp_path: Path) -> None:
    env = demo_env(tmp_path, migrate=False)
    done = subprocess.run(
        [sys.executable, MANAGE, "makemigrations", "--check", "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
