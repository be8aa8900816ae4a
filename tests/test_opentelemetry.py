"""contrib.opentelemetry: a span per delivery, events for each step, never the raw key."""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import signals as celery_signals
from django.db import connection
from django.db.models import F
from django.utils import timezone
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_idempotent_tasks import signals
from django_idempotent_tasks.contrib import opentelemetry
from django_idempotent_tasks.logs import key_hash
from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import Worker, finished, wait_for
from tests.observed_app import SPANS
from tests.testapp import tasks
from tests.testapp.faults import control

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "observed"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    opentelemetry.connect(provider)
    yield exporter
    opentelemetry.disconnect()


def ours(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name.startswith("idempotency ")]


def events(span: ReadableSpan) -> list[str]:
    return [event.name for event in span.events]


def run(task: Any, *args: Any, key: str) -> Any:
    return task.apply(args, {"idempotency_key": key})


def test_a_completion_then_a_replay_are_two_spans(exporter: InMemorySpanExporter) -> None:
    run(tasks.record_effect, 1, key="secret-customer-42")
    run(tasks.record_effect, 1, key="secret-customer-42")
    first, second = ours(exporter)
    assert first.name == f"idempotency {tasks.record_effect.name}"
    assert events(first) == ["idempotency.claim", "idempotency.completed"]
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["idempotency.outcome"] == "completed"
    assert (first.attributes["idempotency.fence"], first.attributes["idempotency.attempt"]) == (1, 1)
    assert first.attributes["idempotency.key_hash"] == key_hash("secret-customer-42")
    assert events(second) == ["idempotency.replay"]
    assert second.attributes["idempotency.outcome"] == "replayed"
    text = json.dumps([dict(span.attributes or {}) for span in exporter.get_finished_spans()])
    assert "secret-customer-42" not in text


def test_take_over_conflict_failure_and_unstorable_are_events(exporter: InMemorySpanExporter) -> None:
    run(tasks.record_effect, 1, key="o-1")
    IdempotencyRecord.objects.filter(key="o-1").update(
        status="IN_PROGRESS", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    run(tasks.record_effect, 1, key="o-1")
    run(tasks.raising_conflict, 0, key="o-2")
    IdempotencyRecord.objects.filter(key="o-2").update(
        status="IN_PROGRESS", lease_expires_at=timezone.now() + timedelta(minutes=5)
    )
    run(tasks.raising_conflict, 0, key="o-2")
    run(tasks.failing, 5, key="o-3")
    run(tasks.unstorable, "nan", key="o-4")
    for _ in range(4):  # max_attempts=3: the fourth delivery finds the key failed for good
        run(tasks.failing, 10, key="o-8")
    by_key: dict[str, list[ReadableSpan]] = {}
    for span in ours(exporter):
        by_key.setdefault(str((span.attributes or {})["idempotency.key_hash"]), []).append(span)
    took_over = by_key[key_hash("o-1")][1]
    conflict = by_key[key_hash("o-2")][1]
    (failed,) = by_key[key_hash("o-3")]
    (unstorable,) = by_key[key_hash("o-4")]
    assert events(took_over) == ["idempotency.take_over", "idempotency.completed"]
    assert dict(took_over.attributes or {})["idempotency.recovered"] is True
    assert events(conflict) == ["idempotency.conflict"]
    assert dict(conflict.attributes or {})["idempotency.outcome"] == "conflict"
    assert events(failed) == ["idempotency.claim", "idempotency.failed"]
    assert failed.status.status_code.name == "ERROR"
    assert events(unstorable) == ["idempotency.claim", "idempotency.unstorable", "idempotency.completed"]
    exhausted = by_key[key_hash("o-8")][-1]
    assert events(exhausted) == ["idempotency.exhausted"]
    assert (dict(exhausted.attributes or {})["idempotency.outcome"], exhausted.status.status_code.name) == (
        "exhausted",
        "ERROR",
    )


def test_a_span_is_a_child_of_celerys_span(exporter: InMemorySpanExporter) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    opentelemetry.connect(provider)
    instrumentor = CeleryInstrumentor()  # type: ignore[no-untyped-call]
    instrumentor.instrument(tracer_provider=provider)
    try:
        run(tasks.record_effect, 1, key="o-5")
    finally:
        instrumentor.uninstrument()
    spans = exporter.get_finished_spans()
    (ours_,) = ours(exporter)
    (celery,) = [span for span in spans if span.name.startswith("run/")]
    assert ours_.parent is not None and celery.context is not None
    assert ours_.parent.span_id == celery.context.span_id


@pytest.mark.workers
def test_a_real_worker_traces_its_deliveries(worker_env: dict[str, str]) -> None:
    control().delete(SPANS)
    worker = Worker("otel", worker_env, app="tests.observed_app", extra=("-Q", QUEUE)).start()
    try:
        tasks.record_effect.apply_async((1,), {"idempotency_key": "otel-1"}, queue=QUEUE)
        finished("otel-1")
        tasks.record_effect.apply_async((1,), {"idempotency_key": "otel-1"}, queue=QUEUE)

        def spans() -> list[dict[str, Any]]:
            found = [json.loads(item) for item in control().lrange(SPANS, 0, -1)]
            ours = [span for span in found if span["name"].startswith("idempotency ")]
            # Celery's span ends (and is exported) after ours: wait for both parents as well.
            exported = {span["span_id"] for span in found}
            return found if len(ours) == 2 and all(span["parent_id"] in exported for span in ours) else []

        found = wait_for(spans, what="two idempotency spans and their parents from the worker")
    finally:
        worker.stop()
    by_id = {span["span_id"]: span for span in found}
    completed, replayed = [span for span in found if span["name"].startswith("idempotency ")]
    assert [event["name"] for event in completed["events"]] == ["idempotency.claim", "idempotency.completed"]
    assert replayed["attributes"]["idempotency.outcome"] == "replayed"
    for span in (completed, replayed):
        assert by_id[span["parent_id"]]["name"] == f"run/{tasks.record_effect.name}"
        assert span["pid"] != worker.pid  # a prefork child, set up after the fork


def test_a_lease_lost_off_the_delivery_thread_opens_no_span(exporter: InMemorySpanExporter) -> None:
    left: list[Any] = []

    def heartbeat() -> None:
        signals.lease_lost.send(sender=tasks.record_effect, key="o-6", scope="s", fence=1)
        left.append(opentelemetry._open.get())

    thread = threading.Thread(target=heartbeat)
    thread.start()
    thread.join()
    assert left == [None] and exporter.get_finished_spans() == ()


def test_the_heartbeats_lease_lost_adds_no_event_to_the_open_span(exporter: InMemorySpanExporter) -> None:
    claimed = {"fence": 1, "attempt": 1, "recovered": False}
    signals.task_claimed.send(sender=tasks.record_effect, key="o-9", scope="s", **claimed)
    # The heartbeat runs its beats in a copy of the delivery's context, where the span is open.
    beat = contextvars.copy_context()
    lost = {"sender": tasks.record_effect, "key": "o-9", "scope": "s", "fence": 1}
    thread = threading.Thread(target=beat.run, args=(signals.lease_lost.send,), kwargs=lost)
    thread.start()
    thread.join()
    signals.task_completed.send(sender=tasks.record_effect, key="o-9", scope="s", fence=1)
    (span,) = ours(exporter)
    assert events(span) == ["idempotency.claim", "idempotency.completed"]
    assert span.attributes is not None and span.attributes["idempotency.outcome"] == "completed"


def test_a_lost_lease_ends_the_span_as_lost(exporter: InMemorySpanExporter) -> None:
    def take_over() -> None:
        time.sleep(0.5)  # while the body sleeps, another delivery takes the lease and finishes
        IdempotencyRecord.objects.filter(key="o-7").update(fence=F("fence") + 1, status="SUCCEEDED")
        connection.close()

    thief = threading.Thread(target=take_over)
    thief.start()
    run(tasks.record_effect, 1, 1.0, key="o-7")
    thief.join()
    (span,) = ours(exporter)
    assert events(span) == ["idempotency.claim", "idempotency.lease_lost"]
    assert dict(span.attributes or {})["idempotency.outcome"] == "lease_lost"


def test_each_signal_is_an_event_and_the_last_names_the_outcome(exporter: InMemorySpanExporter) -> None:
    def send(signal: signals.TaskSignal, key: str, **kwargs: Any) -> None:
        signal.send(sender=tasks.record_effect, key=key, scope="s", **kwargs)

    send(signals.task_claimed, "o-10", fence=1, attempt=1, recovered=False)
    send(signals.result_unstorable, "o-10", reason="NaN")
    send(signals.task_failed, "o-10", fence=1, exc=ValueError("refused"))
    send(signals.lock_conflict, "o-11", action="wait")  # a waiting delivery goes on
    send(signals.lock_conflict, "o-11", action="raise")
    send(signals.attempts_exhausted, "o-12", attempts=5)
    spans = {span.attributes["idempotency.key_hash"]: span for span in ours(exporter) if span.attributes}
    failed, conflict, exhausted = (spans[key_hash(key)] for key in ("o-10", "o-11", "o-12"))
    assert events(failed) == ["idempotency.claim", "idempotency.unstorable", "idempotency.failed"]
    assert events(conflict) == ["idempotency.conflict", "idempotency.conflict"]
    assert events(exhausted) == ["idempotency.exhausted"]
    outcomes = [
        span.attributes["idempotency.outcome"] for span in (failed, conflict, exhausted) if span.attributes
    ]
    assert outcomes == ["failed", "conflict", "exhausted"]
    assert not failed.status.is_ok and not exhausted.status.is_ok


def test_celerys_end_of_the_task_ends_the_span_it_left_open(exporter: InMemorySpanExporter) -> None:
    signals.task_claimed.send(
        sender=tasks.record_effect, key="o-13", scope="s", fence=1, attempt=1, recovered=False
    )
    assert ours(exporter) == []
    celery_signals.task_postrun.send(sender=tasks.record_effect, task_id=None)
    (span,) = ours(exporter)
    assert span.attributes is not None and span.attributes["idempotency.outcome"] == "busy"
