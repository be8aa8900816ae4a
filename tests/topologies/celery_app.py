"""The topology workers' Celery app: the chaos app, plus how long each delivery stays in a child."""

from __future__ import annotations

import os
import random
import time
from typing import Any

from celery.signals import task_postrun, task_prerun

from tests.chaosapp import control as points
from tests.chaosapp.celery_app import app
from tests.chaosapp.control import control

__all__ = ["app"]

#: How long a body holds its claim (and an atomic body its transaction) after its effects: the
#: chaos bodies are instant, and a fault must find keys in flight.
BODY_SECONDS = (0.05, 0.6)
_reached = points.reached


def reached_then_hold(point: str, key: str) -> None:
    _reached(point, key)
    if point == "after_effect":
        time.sleep(random.uniform(*BODY_SECONDS))


points.reached = reached_then_hold


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
