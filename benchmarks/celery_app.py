"""The Celery app of the benchmarks; workers start with ``celery -A benchmarks.celery_app worker``."""

from __future__ import annotations

import os

import django
from celery import Celery

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
