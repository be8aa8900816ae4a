"""The Celery app of the chaos workers: ``celery -A tests.chaosapp.celery_app worker -Q chaos``."""

from __future__ import annotations

import os

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.chaosapp.settings")
django.setup()

app = Celery("chaos")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["tests.chaosapp"])
