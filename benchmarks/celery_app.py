"""The Celery app of the benchmarks; workers start with ``celery -A benchmarks.celery_app worker``."""

from __future__ import annotations

import os
from typing import Any

import django
from celery import Celery
from celery.signals import task_failure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
django.setup()

from benchmarks import settings  # noqa: E402  (our own URLs, not Django's settings object)

app = Celery("benchmarks")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The peers read their own settings from app.conf, outside the CELERY_ namespace.
app.conf.ONCE = {
    "backend": "celery_once.backends.Redis",
    "settings": {"url": settings.PEER_REDIS_URL, "default_timeout": 3600},
}
app.conf.singleton_backend_url = settings.PEER_REDIS_URL
app.conf.imports = ["benchmarks.systems"]


@task_failure.connect
def count_failure(sender: Any = None, **kwargs: Any) -> None:
    """Count every failed task by name: a no-op body leaves no other trace of a unit that never ran."""
    from benchmarks import systems

    systems.stats().hincrby("failures", sender.name, 1)
