"""The test app's workers as docs/observability.md sets them up: each prefork child traces its
deliveries (OpenTelemetry, spans sent to the control Redis for the test to read) and counts them
(Prometheus in multiprocess mode when PROMETHEUS_MULTIPROC_DIR is set)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from celery.signals import worker_process_init, worker_process_shutdown
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tests.celery_app import app  # noqa: F401  (celery -A finds it here)
from tests.testapp.faults import control

SPANS = "otel:spans"


def span_json(span: ReadableSpan) -> dict[str, Any]:
    """What the tests read of a finished span."""
    context, parent = span.get_span_context(), span.parent
    return {
        "name": span.name,
        "trace_id": context.trace_id if context else None,
        "span_id": context.span_id if context else None,
        "parent_id": parent.span_id if parent else None,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": event.name, "attributes": dict(event.attributes or {})} for event in span.events],
        "status": span.status.status_code.name,
        "pid": os.getpid(),
    }


class RedisSpanExporter(SpanExporter):
    """Hands each finished span to the test process through the control Redis."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            control().rpush(SPANS, json.dumps(span_json(span)))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


@worker_process_init.connect(weak=False)
def observe(**kwargs: Any) -> None:
    # In each child, after the fork: a tracer provider and its exporter do not survive a fork.
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from django_idempotent_tasks.contrib import opentelemetry, prometheus

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(RedisSpanExporter()))
    CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
    opentelemetry.connect(provider)
    prometheus.connect()


@worker_process_shutdown.connect(weak=False)
def forget(pid: int | None = None, **kwargs: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())  # type: ignore[no-untyped-call]
