"""The explorer's worker: ``celery -A tests.explorer.celery_app worker -Q explore``, instrumented."""

from __future__ import annotations

import os

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.explorer.settings")
django.setup()

from tests.explorer import probe  # noqa: E402  (needs the settings)

probe.install()
app = Celery("explore")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["tests.explorer"])
