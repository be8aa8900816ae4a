"""The topology workers' Celery app: the chaos app, plus how long each delivery stays in a child."""

from __future__ import annotations

import os
import time
from typing import Any

from celery.signals import task_postrun, task_prerun

from tests.chaosapp.celery_app import app
from tests.chaosapp.control import control

__all__ = ["app"]


@task_prerun.connect
def note_start(task_id: str | None = None, **extra: Any) -> None:
    """The harness samples these to find a delivery stuck in a child (even one killed later)."""
    control().hset("running", f"{task_id} {os.getpid()}", f"{time.time():.3f}")


@task_postrun.connect
def note_end(task_id: str | None = None, **extra: Any) -> None:
    field = f"{task_id} {os.getpid()}"
    started = control().hget("running", field)
    control().hdel("running", field)
    if started is not None:
        control().rpush("runtimes", f"{time.time() - float(started):.3f}")
