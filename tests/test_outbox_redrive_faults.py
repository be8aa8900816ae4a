"""The outbox's re-drive and stored messages when something is off: a record that cannot be sent,
a project without time zones, a countdown or ETA of the wrong type, a key whose body handed on."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
import redis
from celery.utils.time import maybe_iso8601, maybe_make_aware
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.management import CommandError
from django.utils.dateparse import parse_datetime

from django_idempotent_tasks import outbox
from django_idempotent_tasks.exceptions import OutboxError
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.outbox import ReplayedResult
from django_idempotent_tasks.tasks import HANDED_ON, redrive_pending_records
from tests import brokers
from tests.records import age
from tests.running import run_command
from tests.test_admin import detail, login
from tests.testapp.tasks import outbox_effect

pytestmark = pytest.mark.django_db(transaction=True)


def queued() -> list[dict[str, Any]]:
    """The messages waiting at the broker (Redis), as the worker would read them."""
    broker = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    return [json.loads(raw) for raw in broker.lrange("celery", 0, -1)]


def queued_ids() -> list[str]:
    return [message["headers"]["id"] for message in queued()]


@pytest.fixture(autouse=True)
def _redis_broker() -> None:
    if brokers.is_amqp():
        pytest.skip("counts messages in the Redis broker's list")  # the default broker of the suite


def test_a_record_that_no_longer_fits_its_task_is_skipped_and_the_others_are_sent(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.IDEMPOTENT_TASKS_REDRIVE_AFTER = 600
    outbox_effect.delay(1, idempotency_key="rf-stale")
    good = outbox_effect.delay(2, idempotency_key="rf-good")
    brokers.empty()
    stale = IdempotencyRecord.objects.get(key="rf-stale")
    message: Any = stale.message
    message["call"]["kwargs"]["renamed_since"] = 1  # a deploy renamed the task's parameter
    IdempotencyRecord.objects.filter(pk=stale.pk).update(message=message)
    age("rf-stale", 900)  # the oldest: tried first
    age("rf-good", 700)
    out = StringIO()
    with pytest.raises(CommandError, match="1 record could not be sent again; it is left PENDING."):
        run_command("redrive_idempotency_records", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "Sent 1 record again."
    assert lines[1].startswith(f"Could not send {stale} again: TypeError(")
    assert queued_ids() == [good.id]
    errors = [line for line in caplog.records if line.levelno == logging.ERROR]
    assert [(line.name, line.exc_info is not None) for line in errors] == [("django_idempotent_tasks", True)]
    assert str(stale) in errors[0].getMessage()
    assert IdempotencyRecord.objects.get(key="rf-stale").status == IdempotencyRecord.Status.PENDING

    brokers.empty()
    age("rf-good", 700)
    assert redrive_pending_records() == 1  # the periodic task goes past it too
    assert queued_ids() == [good.id]


def worker_reads(eta: str) -> datetime:
    """The instant a Celery worker reads from a message's ETA (celery.worker.request)."""
    parsed = maybe_iso8601(eta)
    assert parsed is not None
    return maybe_make_aware(parsed)


def test_without_time_zones_a_countdown_is_stored_as_the_instant_celery_published(settings: Any) -> None:
    settings.USE_TZ = False
    settings.TIME_ZONE = "America/New_York"  # local time is never UTC here, in any season
    result = outbox_effect.apply_async((1,), {"idempotency_key": "rf-naive"}, countdown=60)
    [message] = queued()
    stored: Any = IdempotencyRecord.objects.get(key="rf-naive").message
    published = worker_reads(message["headers"]["eta"])
    assert abs(worker_reads(stored["eta"]) - published) < timedelta(seconds=2)
    assert parse_datetime(stored["sent_at"]).utcoffset() == timedelta(0)  # type: ignore[union-attr]
    brokers.empty()
    age("rf-naive", 700)
    assert run_command("redrive_idempotency_records") == "Sent 1 record again.\n"
    assert queued_ids() == [result.id]


def test_without_time_zones_the_admin_tells_a_pending_records_age(settings: Any) -> None:
    settings.USE_TZ = False
    settings.TIME_ZONE = "America/New_York"
    outbox_effect.apply_async((1,), {"idempotency_key": "rf-naive-admin"}, countdown=3600)
    admin = login(User.objects.create_superuser("root", "root@example.com", None))
    scheduled = IdempotencyRecord.objects.get(key="rf-naive-admin")
    page = admin.get(detail(scheduled)).content.decode()
    assert "Sent 0 s ago for a run in 59 min (its ETA)" in page


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"eta": "tomorrow"},
            ValueError,
            r"eta must be a datetime or an ISO 8601 datetime string: 'tomorrow'",
        ),
        ({"eta": "2031-02-30T10:00:00"}, ValueError, r"eta must be .*: '2031-02-30T10:00:00' is not an ISO"),
        ({"eta": 60}, TypeError, r"eta must be a datetime or an ISO 8601 datetime string, not int"),
        ({"countdown": "60"}, TypeError, r"countdown must be a number of seconds, not str \('60'\)"),
        ({"expires": "in an hour"}, ValueError, r"expires must be a number of seconds, a datetime or an ISO"),
        ({"expires": [3600]}, TypeError, r"expires must be .*, not list"),
    ],
)
def test_a_time_option_celery_would_not_take_is_refused_and_nothing_is_written_or_sent(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        outbox_effect.apply_async((1,), {"idempotency_key": "rf-when"}, **options)
    assert not IdempotencyRecord.objects.exists()
    assert queued() == []


def test_a_key_whose_body_handed_on_is_not_replayed_at_the_caller_as_its_marker() -> None:
    first = outbox_effect.delay(1, idempotency_key="rf-handed-on")
    brokers.empty()
    # What a worker stores when the body called self.replace() or raised Ignore.
    IdempotencyRecord.objects.filter(key="rf-handed-on").update(
        status=IdempotencyRecord.Status.SUCCEEDED, result=HANDED_ON
    )
    again = outbox_effect.delay(1, idempotency_key="rf-handed-on")
    assert not isinstance(again, ReplayedResult)
    assert again.id == first.id  # the handed-on work's result, as for an attach
    assert queued() == []
    record = IdempotencyRecord.objects.get(key="rf-handed-on")
    assert (record.status, record.result) == (IdempotencyRecord.Status.SUCCEEDED, HANDED_ON)


def test_the_redrive_never_sends_a_record_that_moved_on_since_its_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outbox_effect.delay(1, idempotency_key="moved-on")
    brokers.empty()
    listed = list(IdempotencyRecord.objects.filter(key="moved-on"))  # the re-drive's listing
    # Meanwhile a worker claimed the key and its body failed: a re-send would run it again.
    IdempotencyRecord.objects.filter(key="moved-on").update(status=IdempotencyRecord.Status.FAILED)
    monkeypatch.setattr(outbox, "redrivable", lambda older_than, limit=None: listed)
    done = outbox.redrive(0)
    assert (done.sent, done.unsent, done.broker_error) == ([], [], None)
    assert queued() == []
    with pytest.raises(OutboxError, match="no longer PENDING"):  # the admin's Send again, on a stale page
        outbox.send_again(listed[0])
