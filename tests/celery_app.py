"""The Celery app of the test suite; workers start with ``celery -A tests.celery_app worker``."""

from __future__ import annotations

import os

import django
from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

app = Celery("tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["tests.testapp", "django_idempotent_tasks"])
# As a project should (check --deploy warns otherwise): beat purges the expired records hourly and
# sends again the messages of outbox tasks that never arrived.
app.conf.beat_schedule = {
    "purge-idempotency-records": {"task": "django_idempotent_tasks.purge_expired_records", "schedule": 3600},
    "redrive-idempotency-records": {
        "task": "django_idempotent_tasks.redrive_pending_records",
        "schedule": 300,
    },
}
