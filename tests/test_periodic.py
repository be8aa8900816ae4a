"""The periodic purge task: its result, its discovery by a fresh app and a real worker running it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from celery import Celery

from django_idempotent_tasks.tasks import purge_expired_records
from tests import records
from tests.celery_app import app as tests_app
from tests.helpers import ROOT, Worker, wait_for

NAME = "django_idempotent_tasks.purge_expired_records"


@pytest.mark.django_db
def test_purge_expired_records_deletes_expired_records_only() -> None:
    records.expired("a")
    records.expired("b", "FAILED")
    records.expired("live", "IN_PROGRESS", lease_expires_at=records.FUTURE)
    records.make("fresh")
    assert purge_expired_records.apply(kwargs={"batch_size": 1}).get() == 2
    assert records.keys() == ["fresh", "live"]


def test_a_fresh_app_finds_the_task_with_autodiscover_tasks() -> None:
    script = (
        "import sys, django; django.setup()\n"
        "from celery import Celery\n"
        "assert 'django_idempotent_tasks.tasks' not in sys.modules\n"
        "app = Celery('project')\n"
        "app.config_from_object('django.conf:settings', namespace='CELERY')\n"
        "app.autodiscover_tasks()\n"
        "app.loader.import_default_modules()\n"
        f"print({NAME!r} in app.tasks)\n"
    )
    # Skip the Django checks the worker fixup runs on import: they import task modules themselves.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "CELERY_SKIP_CHECKS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr


def test_the_docs_beat_schedule_names_the_task() -> None:
    page = (ROOT / "docs" / "howto" / "purge.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.DOTALL)
    assert code is not None
    app = Celery("readme", set_as_current=False)
    exec(code[1], {"app": app})
    entry = app.conf.beat_schedule["purge-idempotency-records"]
    assert entry["task"] == NAME
    assert NAME in tests_app.tasks


@pytest.mark.workers
def test_a_worker_runs_the_task_sent_by_name_as_beat_does(running_workers: list[Worker]) -> None:
    for n in range(5):
        records.expired(f"old-{n}")
    records.expired("live", "IN_PROGRESS", lease_expires_at=records.FUTURE)
    records.make("fresh")
    tests_app.send_task(NAME, kwargs={"batch_size": 2})
    # This test's keys only: a message an earlier worker test re-queued may still land a record here.
    mine = ["fresh", "live", *(f"old-{n}" for n in range(5))]
    wait_for(lambda: records.keys(among=mine) == ["fresh", "live"], timeout=90, what="the worker to purge")
