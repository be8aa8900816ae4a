"""The outbox at the caller (``outbox=True``): the PENDING record written in the caller's
transaction, attach, replay and mismatch at enqueue, counted at a real broker with no worker."""

from __future__ import annotations

import base64
import json
import threading
from contextlib import nullcontext
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord
from celery.result import AsyncResult
from celery.utils.time import maybe_iso8601, maybe_make_aware
from django.conf import settings as django_settings
from django.core.management import CommandError
from django.db import close_old_connections, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from kombu.exceptions import SerializerNotInstalled

from django_idempotent_tasks import outbox, store
from django_idempotent_tasks.exceptions import (
    AttemptsExhausted,
    IdempotencyConfigurationError,
    IdempotencyKeyMismatch,
    OutboxError,
)
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.outbox import ReplayedResult
from django_idempotent_tasks.tasks import (
    IdempotentTask,
    fail_discarded_message,
    purge_expired_records,
    redrive_pending_records,
)
from tests import brokers
from tests.records import age
from tests.running import run_command, run_task
from tests.testapp.tasks import outbox_effect, outbox_failing, record_effect

pytestmark = pytest.mark.django_db(transaction=True)
Status = IdempotencyRecord.Status


def queued() -> list[dict[str, Any]]:
    """The messages waiting at the broker (Redis), as the worker would read them."""
    broker = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    return [json.loads(raw) for raw in broker.lrange("celery", 0, -1)]


def stored(key: str) -> dict[str, Any]:
    """The message the record of ``key`` keeps."""
    message = IdempotencyRecord.objects.get(key=key).message
    assert isinstance(message, dict)
    return message


@pytest.fixture(autouse=True)
def _redis_broker() -> None:
    if brokers.is_amqp():
        pytest.skip("counts messages in the Redis broker's list")  # the default broker of the suite


def test_delay_writes_a_pending_record_and_publishes_one_message() -> None:
    result = outbox_effect.delay(1, idempotency_key="ob-new")
    record = IdempotencyRecord.objects.get(key="ob-new")
    assert record.status == Status.PENDING
    assert (record.task_id, record.fence, record.attempts) == (result.id, 0, 0)
    assert stored("ob-new")["task"] == outbox_effect.name
    assert stored("ob-new")["id"] == result.id
    assert [message["headers"]["id"] for message in queued()] == [result.id]


def test_a_second_delay_attaches_and_publishes_nothing() -> None:
    first = outbox_effect.delay(1, idempotency_key="ob-attach")
    second = outbox_effect.delay(1, idempotency_key="ob-attach")
    assert isinstance(second, AsyncResult) and not isinstance(second, ReplayedResult)
    assert second.id == first.id
    assert len(queued()) == 1


def test_a_mismatch_at_enqueue_is_raised_and_nothing_is_written_or_sent() -> None:
    outbox_effect.delay(1, idempotency_key="ob-mismatch")
    with pytest.raises(IdempotencyKeyMismatch):
        outbox_effect.delay(2, idempotency_key="ob-mismatch")
    assert stored("ob-mismatch")["call"]["args"] == [1]
    assert len(queued()) == 1


def test_delay_after_success_publishes_nothing_and_returns_the_stored_value() -> None:
    run_task(outbox_effect, 7, key="ob-done")  # eager: the key SUCCEEDED, no message
    assert IdempotencyRecord.objects.get(key="ob-done").message is None
    result = outbox_effect.delay(7, idempotency_key="ob-done")
    assert isinstance(result, ReplayedResult) and result.replayed
    assert result.get() == {"value": 7, "fence": 1}
    assert queued() == []


def test_a_rollback_leaves_neither_record_nor_message() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox_effect.delay(1, idempotency_key="ob-rollback")
        assert IdempotencyRecord.objects.filter(key="ob-rollback").exists()
        assert queued() == []  # the publish waits for the commit
        raise RuntimeError("the view failed")
    assert not IdempotencyRecord.objects.filter(key="ob-rollback").exists()
    assert queued() == []


def test_the_publish_follows_the_commit() -> None:
    with transaction.atomic():
        result = outbox_effect.delay(1, idempotency_key="ob-commit")
        assert queued() == []
    assert [message["headers"]["id"] for message in queued()] == [result.id]


def test_delay_on_commit_writes_the_record_in_the_callers_transaction() -> None:
    with transaction.atomic():
        outbox_effect.delay_on_commit(1, idempotency_key="ob-on-commit")
        assert IdempotencyRecord.objects.get(key="ob-on-commit").status == Status.PENDING
        assert queued() == []
    assert len(queued()) == 1


def test_signatures_and_groups_go_through_the_outbox() -> None:
    from celery import group

    outbox_effect.s(1, idempotency_key="ob-sig").apply_async()
    outbox_effect.s(1, idempotency_key="ob-sig").apply_async()
    group(outbox_effect.s(n, idempotency_key=f"ob-group-{n}") for n in range(3)).apply_async()
    assert IdempotencyRecord.objects.filter(status=Status.PENDING).count() == 4
    assert len(queued()) == 4


def test_a_chain_whose_first_key_succeeded_is_published_with_the_rest_of_the_chain() -> None:
    # Re-running a chain whose second step failed: the first key replays at its worker, which then
    # sends the second step. Replayed at the caller, the rest of the chain would be dropped.
    run_task(outbox_effect, 1, key="ob-chain-done")
    result = chain(
        outbox_effect.si(1, idempotency_key="ob-chain-done"),
        outbox_effect.si(2, idempotency_key="ob-chain-next"),
    ).apply_async()
    (message,) = queued()
    first = result.parent
    assert isinstance(first, AsyncResult)
    assert message["headers"]["id"] == first.id != IdempotencyRecord.objects.get(key="ob-chain-done").task_id
    assert [step["kwargs"]["idempotency_key"] for step in message_embed(message)["chain"]] == [
        "ob-chain-next"
    ]
    assert IdempotencyRecord.objects.get(key="ob-chain-done").status == Status.SUCCEEDED


def test_a_chain_whose_first_key_is_on_its_way_is_published_too() -> None:
    outbox_effect.delay(1, idempotency_key="ob-chain-pending")  # a plain call: no chain in its message
    brokers.empty()
    chain(
        outbox_effect.si(1, idempotency_key="ob-chain-pending"),
        outbox_effect.si(2, idempotency_key="ob-chain-after"),
    ).apply_async()
    (message,) = queued()
    assert message_embed(message)["chain"], "the rest of the chain travels in the new message"
    assert IdempotencyRecord.objects.filter(key="ob-chain-pending", status=Status.PENDING).count() == 1


# Celery 5.4's Redis result backend sizes a chord with redis-py's setex, which redis-py 8 deprecates
# (Celery 5.7 calls set): a warning of theirs, not of this package.
@pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
def test_a_callback_or_a_chords_body_is_never_dropped_by_a_replay_at_the_caller() -> None:
    run_task(outbox_effect, 1, key="ob-link-done")
    outbox_effect.apply_async(
        (1,),
        {"idempotency_key": "ob-link-done"},
        link=record_effect.si(9, idempotency_key="ob-link-callback"),
    )
    assert [message_embed(message)["callbacks"] is not None for message in queued()] == [True]
    brokers.empty()
    chord(
        [
            outbox_effect.si(1, idempotency_key="ob-link-done"),
            outbox_effect.si(2, idempotency_key="ob-chord-2"),
        ]
    )(record_effect.si(9, idempotency_key="ob-chord-body"))
    # Both members are published: the chord's body runs only once every member's worker reported.
    assert sorted(message["headers"]["task"] for message in queued()) == [outbox_effect.name] * 2
    assert all(message_embed(message)["chord"] for message in queued())


def test_a_key_whose_worker_died_mid_body_is_published_again_not_attached_to() -> None:
    first = outbox_effect.delay(1, idempotency_key="ob-dead-holder")
    brokers.empty()  # the worker took the message, claimed the key and died; the message is gone
    record = store.lookup(outbox_effect.name, "ob-dead-holder")
    assert record is not None
    assert store.take_over(record, task_id=first.id, worker="dead:1", lease_seconds=1, record_ttl=60)
    assert outbox_effect.delay(1, idempotency_key="ob-dead-holder").id == first.id  # its lease lives
    assert queued() == []
    IdempotencyRecord.objects.filter(key="ob-dead-holder").update(
        lease_expires_at=timezone.now() - timedelta(seconds=5)
    )
    again = outbox_effect.delay(1, idempotency_key="ob-dead-holder")
    assert [message["headers"]["id"] for message in queued()] == [again.id] != [first.id]
    assert outbox_effect.apply((1,), {"idempotency_key": "ob-dead-holder"}, task_id=again.id).get() == {
        "value": 1,
        "fence": 2,
    }  # its delivery takes the key over (fence 2: the dead holder's was 1) and runs the body


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "caller's transaction"])
def test_a_call_refused_at_publish_leaves_no_record_for_the_redrive(in_transaction: bool) -> None:
    # The caller is told the call failed (an unknown serializer): no re-drive may send it later.
    with pytest.raises(SerializerNotInstalled), transaction.atomic() if in_transaction else nullcontext():
        outbox_effect.apply_async((1,), {"idempotency_key": "ob-refused"}, serializer="nope")
    assert not IdempotencyRecord.objects.filter(key="ob-refused").exists()
    assert queued() == []
    outbox_effect.delay(1, idempotency_key="ob-refused")  # the key is free for the call made right
    assert IdempotencyRecord.objects.get(key="ob-refused").status == Status.PENDING


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (float("nan"), "not JSON serializable"),
        (float("inf"), "not JSON serializable"),
        ("abc\x00def", "NUL character"),
        ("abc\udc80def", "lone surrogate"),
    ],
    ids=["nan", "infinity", "nul", "surrogate"],
)
def test_arguments_the_record_cannot_hold_are_refused_at_the_call(value: Any, reason: str) -> None:
    # Plain Celery sends them; the outbox stores every call in its record's JSON column, which
    # refuses them on some database (a raw DataError, or a "record kept changing" before).
    with pytest.raises(
        OutboxError, match=f"cannot go through the outbox.*{reason}.*Nothing was written or sent"
    ):
        outbox_effect.delay(value, idempotency_key="ob-unstorable-arguments")
    assert not IdempotencyRecord.objects.exists()
    assert queued() == []


def test_a_publish_that_failed_for_a_service_keeps_the_record_after_the_callers_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With a RabbitMQ broker and a Redis result backend, send_task subscribes to the result first:
    # a Redis outage raises redis' ConnectionError (no broker error). The caller committed its
    # decision, so the PENDING record is the work's only trace: the re-drive sends it.
    def backend_down(*args: Any, **kwargs: Any) -> None:
        raise redis.exceptions.ConnectionError("Error 111 connecting to the result backend.")

    monkeypatch.setattr(outbox_effect.app, "send_task", backend_down)
    with pytest.raises(redis.exceptions.ConnectionError), transaction.atomic():
        outbox_effect.apply_async((1,), {"idempotency_key": "ob-backend-down"})
    assert IdempotencyRecord.objects.get(key="ob-backend-down").status == Status.PENDING


def test_a_discarded_message_fails_only_its_own_pending_record() -> None:
    # What a worker's main process runs on Celery's task_revoked (tests/test_outbox_workers.py has
    # the real revoke and expiry); here its every branch, in-process.
    first = outbox_effect.delay(1, idempotency_key="ob-discarded")

    def discarded(task: Any, task_id: str, kwargs: dict[str, Any], **flags: Any) -> None:
        fail_discarded_message(
            sender=task, request=SimpleNamespace(id=task_id, args=[1], kwargs=kwargs), **flags
        )

    discarded(purge_expired_records, first.id, {"idempotency_key": "ob-discarded"})  # not idempotent
    discarded(outbox_effect, first.id, {})  # no key: no record of its own
    discarded(outbox_effect, "another-message", {"idempotency_key": "ob-discarded"})  # not its message
    assert IdempotencyRecord.objects.get(key="ob-discarded").status == Status.PENDING
    discarded(outbox_effect, first.id, {"idempotency_key": "ob-discarded"}, expired=True)
    record = IdempotencyRecord.objects.get(key="ob-discarded")
    assert (record.status, (record.error or {})["type"]) == (Status.FAILED, "Expired")


def test_a_replay_without_a_canvas_still_publishes_nothing() -> None:
    run_task(outbox_effect, 1, key="ob-plain-done")
    assert isinstance(outbox_effect.si(1, idempotency_key="ob-plain-done").apply_async(), ReplayedResult)
    assert queued() == []


def message_embed(message: dict[str, Any]) -> dict[str, Any]:
    """The canvas a message carries (the third part of Celery's protocol 2 body)."""
    _args, _kwargs, embed = json.loads(base64.b64decode(message["body"]))
    return dict(embed)


def test_a_task_without_the_outbox_writes_nothing_at_enqueue() -> None:
    record_effect.delay(1, idempotency_key="ob-off")
    assert not IdempotencyRecord.objects.filter(key="ob-off").exists()
    assert len(queued()) == 1


def test_the_setting_turns_the_outbox_on(settings: Any) -> None:
    settings.IDEMPOTENT_TASKS_OUTBOX = True
    record_effect.delay(1, idempotency_key="ob-setting")
    assert IdempotencyRecord.objects.get(key="ob-setting").status == Status.PENDING


def test_a_failed_key_goes_back_to_pending_under_a_new_task_id() -> None:
    with pytest.raises(RuntimeError):
        run_task(outbox_failing, 1, key="ob-failed")
    failed = IdempotencyRecord.objects.get(key="ob-failed")
    assert failed.status == Status.FAILED
    result = outbox_failing.delay(1, idempotency_key="ob-failed")
    record = IdempotencyRecord.objects.get(key="ob-failed")
    assert (record.status, record.task_id, record.attempts) == (Status.PENDING, result.id, 1)
    assert result.id != failed.task_id
    assert [message["headers"]["id"] for message in queued()] == [result.id]


def test_a_key_failed_for_good_is_refused_at_enqueue() -> None:
    for _ in range(3):
        with pytest.raises(RuntimeError):
            run_task(outbox_failing, 5, key="ob-exhausted")
    with pytest.raises(AttemptsExhausted):
        outbox_failing.delay(5, idempotency_key="ob-exhausted")
    assert queued() == []


def test_twenty_threads_publish_one_message(connection_crowd: None) -> None:
    barrier = threading.Barrier(20)
    ids: list[str] = []

    def call() -> None:
        try:
            barrier.wait()
            ids.append(outbox_effect.delay(1, idempotency_key="ob-threads").id)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=call) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 20 and len(set(ids)) == 1
    assert [message["headers"]["id"] for message in queued()] == ids[:1]


def test_send_again_republishes_a_pending_record_under_its_task_id() -> None:
    result = outbox_effect.delay(1, idempotency_key="ob-send-again")
    brokers.empty()  # the message was lost
    record = IdempotencyRecord.objects.get(key="ob-send-again")
    assert outbox.send_again(record) == result.id
    assert [message["headers"]["id"] for message in queued()] == [result.id]
    assert queued()[0]["headers"]["task"] == outbox_effect.name


def test_run_again_puts_a_failed_record_back_to_pending_with_attempts_reset() -> None:
    for _ in range(3):
        with pytest.raises(RuntimeError):
            run_task(outbox_failing, 5, key="ob-run-again")
    record = IdempotencyRecord.objects.get(key="ob-run-again")
    assert record.message is None  # run eagerly: no message was stored
    with pytest.raises(OutboxError, match="holds no message"):
        outbox.run_again(record)
    outbox_failing.delay(5, idempotency_key="ob-run-again-2")
    brokers.empty()
    IdempotencyRecord.objects.filter(key="ob-run-again-2").update(status=Status.FAILED, attempts=3)
    failed = IdempotencyRecord.objects.get(key="ob-run-again-2")
    task_id = outbox.run_again(failed)
    again = IdempotencyRecord.objects.get(key="ob-run-again-2")
    assert (again.status, again.attempts, again.task_id) == (Status.PENDING, 0, task_id)
    assert [message["headers"]["id"] for message in queued()] == [task_id]
    with pytest.raises(OutboxError, match="not FAILED"):
        outbox.run_again(again)
    with pytest.raises(OutboxError, match="not PENDING"):
        outbox.send_again(record)


def bound_task(**options: Any) -> Any:
    app = Celery("outbox-rules", set_as_current=False)

    def body(self: Any, value: int) -> int:
        return value

    decorate: Any = app.task
    return decorate(base=IdempotentTask, bind=True, lazy=False, shared=False, name="rules.outbox", **options)(
        body
    )


@pytest.mark.parametrize("value", [1, "yes", 0])
def test_the_outbox_option_is_true_false_or_none(value: Any) -> None:
    with pytest.raises(
        IdempotencyConfigurationError, match=r"outbox must be True, False or None \(use the setting\)"
    ):
        bound_task(outbox=value)
    assert bound_task(outbox=None).idempotency_options.effective_outbox is False


def test_the_outbox_is_an_option_of_the_task_not_of_one_call() -> None:
    with pytest.raises(TypeError, match="outbox is an option of the task, not of one call"):
        outbox_effect.apply_async((1,), {"idempotency_key": "ob-per-call"}, outbox=False)
    assert not IdempotencyRecord.objects.exists()


def test_an_eager_call_writes_no_pending_record(settings: Any) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True
    from tests.celery_app import app

    app.conf.task_always_eager = True
    try:
        assert outbox_effect.delay(3, idempotency_key="ob-eager").get() == {"value": 3, "fence": 1}
    finally:
        app.conf.task_always_eager = False
    assert IdempotencyRecord.objects.get(key="ob-eager").status == Status.SUCCEEDED
    assert queued() == []


def test_the_stored_message_keeps_routing_and_turns_a_countdown_into_an_eta() -> None:
    before = timezone.now()
    outbox_effect.apply_async(
        (1,), {"idempotency_key": "ob-route"}, countdown=60, queue="elsewhere", priority=3, expires=3600
    )
    message = stored("ob-route")
    assert message["options"] == {"queue": "elsewhere", "priority": 3}
    eta = parse_datetime(message["eta"])
    assert eta is not None and before + timedelta(seconds=60) <= eta <= timezone.now() + timedelta(seconds=60)
    assert message["call"] == {"args": [1], "kwargs": {"idempotency_key": "ob-route"}}
    broker = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    # kombu's Redis transport keeps a queue's priorities in lists named after it.
    assert sum(broker.llen(name) for name in broker.keys("elsewhere*")) == 1


def test_an_eta_given_naive_or_as_text_is_stored_as_the_instant_celery_reads(settings: Any) -> None:
    # Celery's worker reads a naive ETA as UTC (celery.utils.time.maybe_make_aware) whatever
    # Django's TIME_ZONE says, and parses text.
    settings.TIME_ZONE = "Europe/Paris"
    naive = datetime(2031, 5, 6, 7, 8, 9)
    outbox_effect.apply_async((1,), {"idempotency_key": "ob-naive"}, eta=naive)
    outbox_effect.apply_async((1,), {"idempotency_key": "ob-text"}, eta="2031-05-06T09:08:09+02:00")
    assert stored("ob-naive")["eta"] == stored("ob-text")["eta"] == "2031-05-06T07:08:09+00:00"
    # What the worker reads from the message published after the commit: the same instant.
    instant = datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt_timezone.utc)
    published = {message["headers"]["id"]: worker_reads(message["headers"]["eta"]) for message in queued()}
    assert published == {stored(key)["id"]: instant for key in ("ob-naive", "ob-text")}
    for key in ("ob-naive", "ob-text"):
        assert worker_reads(stored(key)["eta"]) == instant  # and the one a re-drive would send


def test_a_countdown_given_with_an_eta_wins_as_in_celery() -> None:
    outbox_effect.apply_async(
        (1,), {"idempotency_key": "ob-both"}, eta=datetime(2031, 5, 6, tzinfo=dt_timezone.utc), countdown=60
    )
    (message,) = queued()
    published = worker_reads(message["headers"]["eta"])
    assert published < datetime(2031, 1, 1, tzinfo=dt_timezone.utc)  # Celery took the countdown
    stored_eta = worker_reads(stored("ob-both")["eta"])
    assert abs((stored_eta - published).total_seconds()) < 2  # and so does the re-drive's message


def worker_reads(eta: str) -> datetime:
    """The instant a Celery worker reads from a message's ETA (celery.worker.request)."""
    parsed = maybe_iso8601(eta)
    assert parsed is not None
    return maybe_make_aware(parsed)


def test_the_redrive_command_sends_records_older_than_the_setting(settings: Any) -> None:
    settings.IDEMPOTENT_TASKS_REDRIVE_AFTER = 600
    for n in range(3):
        outbox_effect.delay(n, idempotency_key=f"ob-redrive-{n}")
    brokers.empty()
    age("ob-redrive-0", 700)
    age("ob-redrive-1", 900)
    assert run_command("redrive_idempotency_records", "--dry-run") == "Would send 2 records again.\n"
    assert queued() == []
    assert run_command("redrive_idempotency_records", "--limit", "1") == "Sent 1 record again.\n"
    assert [message["headers"]["id"] for message in queued()] == [
        IdempotencyRecord.objects.get(key="ob-redrive-1").task_id
    ]
    # The re-sent record waits the re-drive age again before its next re-send.
    assert run_command("redrive_idempotency_records") == "Sent 1 record again.\n"
    assert run_command("redrive_idempotency_records") == "No records to send again.\n"
    assert (
        run_command("redrive_idempotency_records", "--older-than", "1m", "--dry-run")
        == "No records to send again.\n"
    )
    assert run_command("redrive_idempotency_records", "--verbosity", "0") == ""


def test_the_redrive_command_prints_json() -> None:
    result = outbox_effect.delay(1, idempotency_key="ob-redrive-json")
    age("ob-redrive-json", 700)
    assert json.loads(run_command("redrive_idempotency_records", "--dry-run", "--json")) == {
        "dry_run": True,
        "count": 1,
        "records": [
            {
                "scope": outbox_effect.name,
                "key": "ob-redrive-json",
                "task": outbox_effect.name,
                "task_id": result.id,
            }
        ],
    }


def test_the_redrive_counts_from_the_messages_eta() -> None:
    outbox_effect.apply_async((1,), {"idempotency_key": "ob-tomorrow"}, countdown=86400)
    age("ob-tomorrow", 3600)  # sent an hour ago, for tomorrow: not lost
    assert run_command("redrive_idempotency_records", "--dry-run") == "No records to send again.\n"
    age("ob-tomorrow", 86400)
    assert run_command("redrive_idempotency_records", "--dry-run") == "Would send 1 record again.\n"
    brokers.empty()
    assert run_command("redrive_idempotency_records") == "Sent 1 record again.\n"
    [message] = queued()  # sent again with its own ETA, as an absolute time
    assert parse_datetime(message["headers"]["eta"]) == parse_datetime(stored("ob-tomorrow")["eta"])


def test_the_periodic_task_redrives(settings: Any) -> None:
    settings.IDEMPOTENT_TASKS_REDRIVE_AFTER = 60
    outbox_effect.delay(1, idempotency_key="ob-periodic")
    brokers.empty()
    assert redrive_pending_records() == 0
    age("ob-periodic", 61)
    assert redrive_pending_records() == 1
    assert len(queued()) == 1


def test_the_redrive_age_and_limit_are_validated() -> None:
    for args, error in [
        (("--older-than", "0s"), "'0s' is not a duration"),
        (("--older-than", "soon"), "'soon' is not a duration"),
        (("--limit", "0"), "'0' is not a positive integer"),
    ]:
        with pytest.raises(CommandError, match=error):
            run_command("redrive_idempotency_records", *args)


def test_the_purge_never_deletes_a_pending_record() -> None:
    outbox_effect.delay(1, idempotency_key="ob-purge")
    IdempotencyRecord.objects.filter(key="ob-purge").update(expires_at=timezone.now() - timedelta(days=1))
    assert run_command("purge_idempotency_records") == "No records to delete.\n"
    with pytest.raises(CommandError, match="PENDING records are never purged"):
        run_command("purge_idempotency_records", "--older-than", "1m", "--status", "PENDING")
    assert purge_expired_records() == 0
    assert IdempotencyRecord.objects.get(key="ob-purge").status == Status.PENDING
