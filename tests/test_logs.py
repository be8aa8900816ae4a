"""Every log record of the package carries the delivery's task id, scope, key hash, fence, attempt, outcome."""

from __future__ import annotations

import hashlib
import io
import logging
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_idempotent_tasks import logs, signals
from django_idempotent_tasks.heartbeat import Heartbeat
from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import wait_for
from tests.testapp import functions, tasks

pytestmark = pytest.mark.django_db(transaction=True)

FORMAT = (
    "%(levelname)s %(task_id)s %(idempotency_scope)s %(idempotency_key_hash)s %(idempotency_fence)s "
    "%(idempotency_attempt)s %(idempotency_outcome)s | %(message)s"
)
SCOPE = "tests.testapp.tasks.failing"


@pytest.fixture
def lines() -> Iterator[Callable[[], list[str]]]:
    """The formatted lines a real handler on the package's logger wrote during the test."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(FORMAT))
    logger = logging.getLogger("django_idempotent_tasks")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lambda: stream.getvalue().splitlines()
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_the_key_is_hashed_not_written() -> None:
    assert logs.key_hash("order-charge-42") == hashlib.sha256(b"order-charge-42").hexdigest()[:16]
    assert len(logs.key_hash("order-charge-42")) == 16
    assert logs.key_hash("order-charge-42") != logs.key_hash("order-charge-43")


def test_each_line_of_a_delivery_carries_its_context(lines: Callable[[], list[str]]) -> None:
    key = "logged-key"
    digest = logs.key_hash(key)
    tasks.failing.apply((1,), {"idempotency_key": key}, task_id="task-1")  # attempt 1 fails
    tasks.failing.apply((1,), {"idempotency_key": key}, task_id="task-2")  # attempt 2 succeeds, silently
    tasks.failing.apply((1,), {"idempotency_key": key}, task_id="task-3")  # replays
    tasks.failing.apply((2,), {"idempotency_key": key}, task_id="task-4")  # other arguments: mismatch
    logging.getLogger("django_idempotent_tasks").info("between deliveries")

    assert lines() == [
        f"INFO task-1 {SCOPE} {digest} 1 1 failed | {SCOPE}[{key}] failed with "
        "RuntimeError('attempt 1 fails'); the next delivery may run it again.",
        f"INFO task-3 {SCOPE} {digest} None None replayed | {SCOPE}[{key}] already succeeded; "
        "replaying the stored result.",
        f"ERROR task-4 {SCOPE} {digest} None None mismatch | {SCOPE}[{key}] was sent again with "
        "different arguments; not executed.",
        "INFO None None None None None None | between deliveries",
    ]


def test_a_key_failed_for_good_logs_the_exhausted_outcome(lines: Callable[[], list[str]]) -> None:
    scope = "tests.testapp.tasks.fails_for_good"
    digest = logs.key_hash("doomed")
    tasks.fails_for_good.apply((1,), {"idempotency_key": "doomed"}, task_id="only")  # its one attempt
    tasks.fails_for_good.apply((1,), {"idempotency_key": "doomed"}, task_id="after")
    assert [line.split(" | ")[0] for line in lines()] == [
        f"INFO only {scope} {digest} 1 1 failed",
        f"ERROR after {scope} {digest} None None exhausted",
    ]


def test_a_conflict_line_carries_the_conflict_outcome(lines: Callable[[], list[str]]) -> None:
    tasks.raising_conflict.apply((0,), {"idempotency_key": "held"}, task_id="first")
    # The record is made IN_PROGRESS with a live lease, as a running holder leaves it.
    IdempotencyRecord.objects.filter(key="held").update(
        status="IN_PROGRESS", lease_expires_at=timezone.now() + timedelta(minutes=5)
    )
    tasks.raising_conflict.apply((0,), {"idempotency_key": "held"}, task_id="second")
    scope = "tests.testapp.tasks.raising_conflict"
    assert lines() == [
        f"INFO second {scope} {logs.key_hash('held')} None None conflict | {scope}[held] is held by "
        "another delivery; on_conflict=raise."
    ]


def test_a_heartbeat_thread_logs_under_its_delivery_context(lines: Callable[[], list[str]]) -> None:
    def beat() -> bool:
        logging.getLogger("django_idempotent_tasks").warning("renewal failed")
        return False

    token = logs.current.set(logs.LogContext("task-9", "scope-9", "hash-9", fence=3, attempt=2))
    try:
        heartbeat = Heartbeat(0.01, beat)  # made inside the delivery: it beats in a copy of its context
        heartbeat.begin()
    finally:
        logs.current.reset(token)
    thread = wait_for(lambda: heartbeat.thread, timeout=10, what="the heartbeat to start")
    thread.join(timeout=10)
    assert lines() == ["WARNING task-9 scope-9 hash-9 3 2 started | renewal failed"]


def test_installing_twice_adds_one_filter() -> None:
    logs.install()
    logger = logging.getLogger("django_idempotent_tasks")
    assert sum(isinstance(f, logs.ContextFilter) for f in logger.filters) == 1


def test_fields_given_by_the_caller_are_kept(lines: Callable[[], list[str]]) -> None:
    logging.getLogger("django_idempotent_tasks").info("explicit", extra={"task_id": "mine"})
    assert lines() == ["INFO mine None None None None None | explicit"]


def test_signals_sent_outside_a_delivery_leave_the_log_context_alone() -> None:
    seen: list[Any] = []

    def send() -> None:  # a thread of its own: no delivery runs in it
        # The log context observes these signals (no receiver): with no delivery to update, the
        # observers must neither raise nor start a context.
        signals.task_claimed.send(
            sender=tasks.failing, key="k", scope="s", fence=1, attempt=1, recovered=False
        )
        signals.task_replayed.send(sender=tasks.failing, key="k", scope="s")
        seen.append(logs.context())

    thread = threading.Thread(target=send)
    thread.start()
    thread.join()
    assert seen == [None]  # the sends returned and started no context


def test_no_log_context_is_left_after_a_function_call(lines: Callable[[], list[str]]) -> None:
    functions.record(1, idempotency_key="logged-function")
    functions.record(1, idempotency_key="logged-function")  # a replay logs one line inside
    logging.getLogger("django_idempotent_tasks").info("after the call")
    assert lines()[-1] == "INFO None None None None None None | after the call"
    assert logs.context() is None


def test_no_log_context_is_left_after_a_direct_task_call(lines: Callable[[], list[str]]) -> None:
    tasks.record_effect(1, idempotency_key="logged-direct")  # no Celery tracer, so no task_postrun
    logging.getLogger("django_idempotent_tasks").info("after the call")
    assert lines() == ["INFO None None None None None None | after the call"]


def test_a_signal_that_is_no_outcome_leaves_the_outcome_as_it_was() -> None:
    # database_unreachable is sent through the delivery while its log context is open, before the
    # delivery is re-queued: it must not fail the delivery, nor name its outcome.
    token = logs.enter("t-1", "scope", "key")
    try:
        logs.note(signals.task_claimed, fence=1, attempt=1)
        logs.note(signals.database_unreachable, alias="default", error="gone", seconds=61.0)
        context = logs.context()
        assert context is not None and context.outcome == "claimed"
    finally:
        logs.leave(token)
