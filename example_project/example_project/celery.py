"""The Celery app: ``celery -A example_project worker`` (run from the directory of manage.py)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["shop.demo"])  # the demo's plain task, kept apart from the shop's
