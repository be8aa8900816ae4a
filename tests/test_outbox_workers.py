"""The outbox end to end, with real callers, a real broker and a real ``celery worker``: nothing
lost (the re-drive sends what never arrived), nothing twice (one message, one body)."""

from __future__ import annotations

import datetime
import decimal
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import chain
from django.conf import settings
from django.db import close_old_connections, transaction

from django_idempotent_tasks import outbox
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.outbox import ReplayedResult
from tests import brokers
from tests.helpers import ROOT, Worker, calls, conflicts, finished, replays, wait_for
from tests.running import run_command
from tests.testapp.faults import control
from tests.testapp.tasks import outbox_effect, outbox_retrying, outbox_typed

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]
Status = IdempotencyRecord.Status
#: A queue of these tests' own: the suite's shared workers never take its messages.
QUEUE = "outbox-tests"
PROCESS_TIMEOUT = 120  # seconds a caller process may take, Django set-up included
DEAD_BROKER_URL = "redis://127.0.0.1:1/0"


@pytest.fixture(autouse=True)
def _redis_broker() -> None:
    if brokers.is_amqp():
        pytest.skip("reads and deletes messages in the Redis broker's lists")


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def queued() -> list[str]:
    """The task ids of the messages waiting in the tests' queue."""
    return [json.loads(raw)["headers"]["id"] for raw in broker().lrange(QUEUE, 0, -1)]


@pytest.fixture
def worker(worker_env: dict[str, str]) -> Iterator[Worker]:
    """A real worker of the tests' queue, started by ``.start()`` when the test is ready for it."""
    started = Worker("outbox", worker_env, extra=("-Q", QUEUE))
    yield started
    if started.process is not None:
        started.stop()


def caller(worker_env: dict[str, str], mode: str, key: str, **env: str) -> subprocess.Popen[str]:
    """A caller in its own process (tests/outbox_caller.py)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.outbox_caller", mode, key, QUEUE],
        cwd=ROOT,
        env={**os.environ, **worker_env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def redrive() -> str:
    time.sleep(1.1)  # the records must be older than the age asked for
    return run_command("redrive_idempotency_records", "--older-than", "1s")


def test_a_message_lost_by_the_broker_is_sent_again_and_runs_once(worker: Worker) -> None:
    result = outbox_effect.apply_async((1,), {"idempotency_key": "obw-lost"}, queue=QUEUE)
    assert queued() == [result.id]
    broker().delete(QUEUE)  # the broker lost it (a restart without persistence, a purge)
    assert redrive() == "Sent 1 record again.\n"
    assert queued() == [result.id]
    worker.start()
    record = finished("obw-lost")
    assert (record.task_id, record.fence, record.attempts, record.message) == (result.id, 1, 1, None)
    assert calls("obw-lost") == 1
    assert run_command("redrive_idempotency_records", "--older-than", "1s") == "No records to send again.\n"


def test_arguments_of_every_json_type_celery_keeps_survive_a_redrive(worker: Worker) -> None:
    args = (
        datetime.datetime(2026, 12, 3, 17, 0, 0, 123456, tzinfo=datetime.timezone.utc),
        decimal.Decimal("10.50"),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        ("a", 1),
    )
    outbox_typed.apply_async(args, {"idempotency_key": "obw-typed"}, queue=QUEUE)
    outbox_typed.apply_async(args, {"idempotency_key": "obw-typed-lost"}, queue=QUEUE)
    broker().delete(QUEUE)
    outbox_typed.apply_async(args, {"idempotency_key": "obw-typed"}, queue=QUEUE)  # attaches
    assert redrive() == "Sent 2 records again.\n"
    worker.start()
    for key in ("obw-typed", "obw-typed-lost"):
        # Same fingerprint in the worker as at the caller, or the delivery would be a mismatch.
        assert finished(key).result == {
            "value": ["2026-12-03 17:00:00.123456+00:00", "10.50", str(args[2]), ["a", 1]],
            "fence": 1,
        }
        assert calls(key) == 1


def test_a_caller_killed_between_its_commit_and_its_publish_is_redriven(
    worker: Worker, worker_env: dict[str, str]
) -> None:
    killed = caller(worker_env, "killed", "obw-killed")
    killed.communicate(timeout=PROCESS_TIMEOUT)
    assert killed.returncode == -signal.SIGKILL
    record = IdempotencyRecord.objects.get(key="obw-killed")
    assert record.status == Status.PENDING
    assert queued() == []  # committed, never published
    assert redrive() == "Sent 1 record again.\n"
    worker.start()
    assert finished("obw-killed").task_id == record.task_id
    assert calls("obw-killed") == 1


def test_a_broker_down_at_publish_time_warns_and_the_redrive_sends_it_later(
    worker: Worker, worker_env: dict[str, str]
) -> None:
    down = caller(worker_env, "commit", "obw-down", IDEMPOTENT_TESTS_BROKER_URL=DEAD_BROKER_URL)
    out, err = down.communicate(timeout=PROCESS_TIMEOUT)
    assert down.returncode == 0, err  # the request succeeded
    assert "WARNING django_idempotent_tasks:" in err  # logged, not raised
    record = IdempotencyRecord.objects.get(key="obw-down")
    assert (record.status, record.task_id) == (Status.PENDING, out.strip())
    assert redrive() == "Sent 1 record again.\n"  # the broker is back
    worker.start()
    finished("obw-down")
    assert calls("obw-down") == 1


def command(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py redrive_idempotency_records ARGS`` in its own process, the test app's Celery app
    loaded as a project's __init__.py loads its own (unless ``without_app``)."""
    script = "import sys, tests.celery_app; from django.core import management; management.call_command(*sys.argv[1:])"
    return subprocess.run(
        [sys.executable, "-c", script, "redrive_idempotency_records", *args],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **env},
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )


def test_a_redrive_while_the_broker_is_down_fails_loudly_and_keeps_the_record(
    worker_env: dict[str, str],
) -> None:
    outbox_effect.apply_async((1,), {"idempotency_key": "obw-still-down"}, queue=QUEUE)
    broker().delete(QUEUE)
    time.sleep(1.1)
    down = command("--older-than", "1s", **worker_env, IDEMPOTENT_TESTS_BROKER_URL=DEAD_BROKER_URL)
    assert down.returncode == 1
    assert "CommandError: The broker refused a message" in down.stderr
    assert "1 left PENDING" in down.stderr
    assert IdempotencyRecord.objects.get(key="obw-still-down").status == Status.PENDING
    assert command("--older-than", "1s", **worker_env).stdout == "Sent 1 record again.\n"
    assert queued() == [IdempotencyRecord.objects.get(key="obw-still-down").task_id]


def test_twenty_threads_and_two_processes_publish_one_message_and_run_one_body(
    worker: Worker, worker_env: dict[str, str], connection_crowd: None
) -> None:
    processes = [caller(worker_env, "race", "obw-race") for _ in range(2)]
    time.sleep(8)  # let both processes set Django up and wait for the go (not a timed assertion)
    barrier = threading.Barrier(20)
    ids: list[str] = []

    def call() -> None:
        try:
            barrier.wait()
            ids.append(outbox_effect.apply_async((1,), {"idempotency_key": "obw-race"}, queue=QUEUE).id)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=call) for _ in range(20)]
    control().set("go:obw-race", 1)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for process in processes:
        out, err = process.communicate(timeout=PROCESS_TIMEOUT)
        assert process.returncode == 0, err
        ids.extend(out.split())
    assert len(ids) == 40 and len(set(ids)) == 1
    assert queued() == ids[:1]  # one message published
    worker.start()
    finished("obw-race")
    assert calls("obw-race") == 1


def test_delay_after_success_publishes_nothing_and_returns_the_workers_value(worker: Worker) -> None:
    worker.start()
    outbox_effect.apply_async((5,), {"idempotency_key": "obw-done"}, queue=QUEUE)
    finished("obw-done")
    wait_for(lambda: not queued() and not broker().hlen("unacked"), what="the message to be acked")
    again = outbox_effect.apply_async((5,), {"idempotency_key": "obw-done"}, queue=QUEUE)
    assert isinstance(again, ReplayedResult)
    assert again.get() == {"value": 5, "fence": 1}
    assert queued() == []  # counted at the broker: nothing was published
    assert calls("obw-done") == 1


def test_a_redrive_of_a_message_that_was_only_slow_is_a_duplicate_that_replays(worker: Worker) -> None:
    with transaction.atomic():
        result = outbox_effect.apply_async((1,), {"idempotency_key": "obw-slow"}, queue=QUEUE)
    assert redrive() == "Sent 1 record again.\n"  # the first message is still queued: only slow
    assert queued() == [result.id, result.id]
    worker.start()
    finished("obw-slow")
    wait_for(lambda: replays("obw-slow") == 1, what="the duplicate to replay")
    assert calls("obw-slow") == 1


def test_self_retry_of_an_outbox_task_is_sent_not_taken_for_new_work(worker: Worker) -> None:
    worker.start()
    outbox_retrying.apply_async((2,), {"idempotency_key": "obw-retry"}, queue=QUEUE)
    record = finished("obw-retry")
    assert (record.attempts, record.message) == (3, None)
    assert calls("obw-retry") == 3


def test_a_conflicts_requeue_is_sent_not_taken_for_new_work(worker: Worker) -> None:
    worker.start()
    result = outbox_effect.apply_async((1, 3), {"idempotency_key": "obw-conflict"}, queue=QUEUE)
    wait_for(lambda: calls("obw-conflict") == 1, what="the body to start")
    running = IdempotencyRecord.objects.get(key="obw-conflict")
    assert running.status == Status.IN_PROGRESS and isinstance(running.message, dict)
    outbox.publish(running.message)  # a duplicate of the message, while its body runs
    finished("obw-conflict")
    # The duplicate found the key held and was re-queued (the record was IN_PROGRESS: the outbox
    # would have attached and sent nothing); it then replayed.
    wait_for(lambda: replays("obw-conflict") == 1, what="the re-queued duplicate to replay")
    assert conflicts("obw-conflict") and calls("obw-conflict") == 1
    assert IdempotencyRecord.objects.get(key="obw-conflict").task_id == result.id


def test_a_chain_of_outbox_tasks_records_the_first_at_the_caller_and_runs_each_once(worker: Worker) -> None:
    steps = chain(
        outbox_effect.si(1, idempotency_key="obw-chain-1").set(queue=QUEUE),
        outbox_effect.si(2, idempotency_key="obw-chain-2").set(queue=QUEUE),
    )
    steps.apply_async()
    assert IdempotencyRecord.objects.get(key="obw-chain-1").status == Status.PENDING
    assert not IdempotencyRecord.objects.filter(key="obw-chain-2").exists()  # the worker sends it
    broker().delete(QUEUE)  # lost: the re-drive keeps the rest of the chain
    assert redrive() == "Sent 1 record again.\n"
    worker.start()
    finished("obw-chain-1")
    finished("obw-chain-2")
    assert (calls("obw-chain-1"), calls("obw-chain-2")) == (1, 1)


def test_a_chain_run_again_after_its_first_key_succeeded_runs_its_second_step(worker: Worker) -> None:
    worker.start()
    outbox_effect.apply_async((1,), {"idempotency_key": "obw-rerun-1"}, queue=QUEUE)
    finished("obw-rerun-1")
    chain(
        outbox_effect.si(1, idempotency_key="obw-rerun-1").set(queue=QUEUE),
        outbox_effect.si(2, idempotency_key="obw-rerun-2").set(queue=QUEUE),
    ).apply_async()
    finished("obw-rerun-2")  # the first step replayed at its worker, which sent the second
    wait_for(lambda: replays("obw-rerun-1") == 1, what="the first step to replay")
    assert (calls("obw-rerun-1"), calls("obw-rerun-2")) == (1, 1)


def test_a_message_that_expired_before_a_worker_took_it_fails_its_key(worker: Worker) -> None:
    outbox_effect.apply_async((1,), {"idempotency_key": "obw-expired"}, queue=QUEUE, expires=1)
    time.sleep(1.5)
    worker.start()  # discards the expired message unrun
    record = finished("obw-expired", status=Status.FAILED)
    assert (record.error or {}).get("type") == "Expired"
    assert redrive() == "No records to send again.\n"  # it was never sent again with its dead expiry
    again = outbox_effect.apply_async((1,), {"idempotency_key": "obw-expired"}, queue=QUEUE)
    finished("obw-expired")  # a new call under the key runs it
    assert (calls("obw-expired"), IdempotencyRecord.objects.get(key="obw-expired").task_id) == (1, again.id)


def test_a_revoked_message_stays_cancelled_after_a_redrive(worker: Worker) -> None:
    from tests.celery_app import app

    worker.start()
    result = outbox_effect.apply_async((1,), {"idempotency_key": "obw-revoked"}, queue=QUEUE, countdown=3)
    wait_for(lambda: not broker().llen(QUEUE), what="the worker to hold the message until its ETA")
    app.control.revoke(result.id)
    record = finished("obw-revoked", status=Status.FAILED)
    assert (record.error or {}).get("type") == "Revoked"
    assert redrive() == "No records to send again.\n"
    time.sleep(1)
    assert calls("obw-revoked") == 0
