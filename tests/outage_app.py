"""The test app for a worker whose records' database is gone: its log records and the Prometheus
counter written as JSON lines, for tests/test_outages.py to read from the worker's output."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from celery.signals import worker_process_init
from prometheus_client import REGISTRY

from django_idempotent_tasks import signals
from django_idempotent_tasks.contrib import prometheus
from tests.celery_app import app

__all__ = ["app"]
MARK = "OUTAGE-JSON "
FIELDS = ("database_alias", "database_error", "unreachable_seconds")


class JsonLines(logging.Formatter):
    """One JSON object per record: its level, logger and the outage's structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {name: getattr(record, name, None) for name in FIELDS}
        return MARK + json.dumps({"level": record.levelname, "logger": record.name, **fields})


def report_counter(sender: Any, alias: str, **kwargs: Any) -> None:
    """After the Prometheus receiver (connected first): the counter's value, as a JSON line."""
    labels = {"task": sender.name, "database": alias}
    value = REGISTRY.get_sample_value("idempotent_tasks_database_unreachable_total", labels)
    sys.__stderr__.write(MARK + json.dumps({"counter": value, **labels}) + "\n")  # type: ignore[union-attr]
    sys.__stderr__.flush()  # type: ignore[union-attr]


@worker_process_init.connect
def write_json_lines(**kwargs: Any) -> None:
    """In each child, once Django's LOGGING has been applied (it replaces the logger's handlers)."""
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(JsonLines())
    logging.getLogger("django_idempotent_tasks").addHandler(handler)


prometheus.connect()
signals.database_unreachable.connect(report_counter, weak=False, dispatch_uid="tests.outage_app")
