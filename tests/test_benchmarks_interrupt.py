"""An interrupted benchmark run leaves no worker behind (Ctrl-C, SIGTERM, or its own process killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tests.helpers import ROOT, START_TIMEOUT, wait_for

pytestmark = [
    pytest.mark.workers,
    pytest.mark.bench,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="section 2 runs on PostgreSQL only"),
]


def workers_of(run: subprocess.Popen[str]) -> list[int]:
    """The worker processes a benchmark run started (named after the run's pid)."""
    found = subprocess.run(["pgrep", "-f", f"bench-[a-z]+-{run.pid}@"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


@pytest.fixture
def database_url(django_db_blocker: Any) -> Iterator[str]:
    """A database of its own, which the benchmark creates; dropped afterwards."""
    name = f"{connection.settings_dict['NAME']}_bench_interrupt"
    # The suite's own database URL (its default when DATABASE_URL is unset, as in CI), renamed.
    yield settings.DATABASE_URL._replace(path=f"/{name}").geturl()
    with django_db_blocker.unblock(), connection._nodb_cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize(
    "signals",
    [
        (signal.SIGINT,),
        (signal.SIGTERM,),
        # Ctrl-C pressed again while the workers stop: they are killed at once.
        (signal.SIGINT, signal.SIGINT),
        pytest.param(
            (signal.SIGKILL,),
            marks=pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's"),
        ),
    ],
    ids=["SIGINT", "SIGTERM", "SIGINT twice", "SIGKILL"],
)
def test_an_interrupted_run_leaves_no_worker(
    database_url: str, signals: tuple[int, ...], tmp_path: Path
) -> None:
    stderr = tmp_path / "stderr"
    with stderr.open("w") as log:
        run = subprocess.Popen(
            [sys.executable, "-m", "benchmarks", "--quick", "--sections", "e2e"],
            cwd=ROOT,
            # The run's own Redis server (tests/isolation.py): the benchmark flushes databases 1 to 4 of it.
            env={**os.environ, "DATABASE_URL": database_url, "REDIS_URL": settings.REDIS_URL},
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
    try:
        wait_for(lambda: workers_of(run), timeout=START_TIMEOUT, what="the benchmark's worker")
        for signum in signals:
            run.send_signal(signum)
            time.sleep(0.05)
        run.wait(timeout=60)
        wait_for(lambda: not workers_of(run), timeout=30, what="the worker to stop")
    finally:
        for pid in workers_of(run):
            os.killpg(pid, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
            run.wait()
    # Ctrl-C, and SIGTERM from make or a CI runner, end the run with 130; SIGKILL ends it at once.
    expected = -signal.SIGKILL if signals[0] == signal.SIGKILL else 130
    assert run.returncode == expected, stderr.read_text()[-2000:]
