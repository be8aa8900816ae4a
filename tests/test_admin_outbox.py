"""The admin's outbox records: PENDING listed with its age, Send again and Run again, each a POST
with a History entry, refused without the permission, a CSRF token or a stored message."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_idempotent_tasks import outbox
from django_idempotent_tasks.models import IdempotencyRecord
from tests import brokers, records
from tests.admin_pages import listed_keys, queries_of
from tests.test_admin import CHANGELIST, action, detail, login, staff
from tests.test_outbox import queued
from tests.testapp.tasks import outbox_effect, outbox_failing

pytestmark = pytest.mark.django_db
Status = IdempotencyRecord.Status


def send_again_url(record: IdempotencyRecord) -> str:
    return reverse("admin:django_idempotent_tasks_idempotencyrecord_send_again", args=[record.pk])


def run_again_url(record: IdempotencyRecord) -> str:
    return reverse("admin:django_idempotent_tasks_idempotencyrecord_run_again", args=[record.pk])


@pytest.fixture
def superuser() -> Client:
    return login(User.objects.create_superuser("root", "root@example.com", None))


def test_pending_records_have_a_filter_choice_and_a_badge_with_their_age(superuser: Client) -> None:
    pending = records.pending("order-charge-3001", age=12 * 60, shop=True)
    records.make("order-charge-3002", shop=True)
    html = superuser.get(CHANGELIST).content.decode()
    assert "?status__exact=PENDING" in html
    assert "idempotency-status-pending" in html
    assert ">Pending 12 min</span>" in html
    listing = superuser.get(f"{CHANGELIST}?status__exact=PENDING").content.decode()
    assert listed_keys(listing) == [pending.key]


def test_the_changelist_query_count_does_not_grow_with_pending_rows(superuser: Client) -> None:
    records.pending("pending-0", shop=True)
    superuser.get(CHANGELIST)  # fills Django's content type cache
    _html, few = queries_of(superuser, CHANGELIST)
    for n in range(1, 30):
        records.pending(f"pending-{n}", shop=True, age=n * 100)
    html, many = queries_of(superuser, CHANGELIST)
    assert len(many) == len(few), many
    assert len(listed_keys(html)) == 30


def test_the_detail_page_tells_the_age_and_shows_the_stored_message(superuser: Client) -> None:
    fresh = records.pending("order-charge-3003", age=30, shop=True)
    page = superuser.get(detail(fresh)).content.decode()
    assert "Sent 30 s ago, on its way to a worker: the re-drive sends it again once it is 600 s old." in page
    assert "&quot;idempotency_key&quot;: &quot;order-charge-3003&quot;" in page
    late = records.pending("order-charge-3004", age=3 * 3600, shop=True)
    page = superuser.get(detail(late)).content.decode()
    assert "Sent 3 h ago, past the re-drive age (600 s), and no worker has taken it" in page
    assert "redrive_idempotency_records" in page
    scheduled = records.pending("order-charge-3005", age=3 * 3600, shop=True)
    eta = (timezone.now() + timedelta(hours=5, seconds=30)).isoformat()
    scheduled.message = {**records.message(records.CHARGE, scheduled.key, age=3 * 3600), "eta": eta}
    scheduled.save()
    page = superuser.get(detail(scheduled)).content.decode()
    assert "Sent 3 h ago for a run in 5 h (its ETA): the re-drive waits 600 s past the ETA." in page


def test_buttons_only_for_outbox_records_and_the_permission(superuser: Client) -> None:
    pending = records.pending("order-charge-3005", shop=True)
    failed = records.failed("receipt-3006", shop=True, message=records.message(records.EMAIL, "receipt-3006"))
    bare_failed = records.failed("receipt-3007", shop=True)
    bare_pending = records.pending("order-charge-3008", shop=True, message=None)
    page = superuser.get(detail(pending)).content.decode()
    assert f'href="{send_again_url(pending)}" class="idempotency-send-again"' in page
    assert "idempotency-run-again" not in page
    page = superuser.get(detail(failed)).content.decode()
    assert f'href="{run_again_url(failed)}" class="idempotency-run-again"' in page
    assert "idempotency-send-again" not in page
    for bare in (bare_failed, bare_pending):
        page = superuser.get(detail(bare)).content.decode()
        assert "idempotency-send-again" not in page and "idempotency-run-again" not in page
        assert "No stored message: this key was not sent through the outbox" in page
    succeeded = superuser.get(detail(records.make("order-charge-3009", shop=True))).content.decode()
    assert "Outbox" not in succeeded and "No stored message" not in succeeded

    viewer = login(staff("viewer", "view_idempotencyrecord"))
    page = viewer.get(detail(pending)).content.decode()
    assert "idempotency-send-again" not in page
    changelist = viewer.get(CHANGELIST).content.decode()
    assert "send_again_selected" not in changelist and "run_again_selected" not in changelist
    for url in (send_again_url(pending), run_again_url(failed)):
        assert viewer.get(url).status_code == 403
        assert viewer.post(url, {"post": "yes"}).status_code == 403
    assert "send_again_selected" in superuser.get(CHANGELIST).content.decode()


def test_a_record_without_a_message_or_in_another_status_is_left_alone(superuser: Client) -> None:
    bare = records.failed("receipt-3010", shop=True)
    response = superuser.post(run_again_url(bare), {"post": "yes"}, follow=True)
    assert response.redirect_chain == [(detail(bare), 302)]
    assert "No stored message: this key was not sent through the outbox" in response.content.decode()
    pending = records.pending("order-charge-3011", shop=True)
    response = superuser.post(run_again_url(pending), {"post": "yes"}, follow=True)
    assert "is Pending, not Failed: nothing was changed." in response.content.decode()
    succeeded = records.make("order-charge-3012", shop=True, message=records.message(records.CHARGE, "x"))
    response = superuser.post(send_again_url(succeeded), {"post": "yes"}, follow=True)
    assert "is Succeeded, not Pending: nothing was changed." in response.content.decode()
    assert superuser.get(send_again_url(records.make("k", shop=True))).status_code == 302
    missing = reverse("admin:django_idempotent_tasks_idempotencyrecord_send_again", args=[pending.pk + 1000])
    assert superuser.get(missing).status_code == 404
    assert IdempotencyRecord.objects.get(pk=bare.pk).status == Status.FAILED
    assert IdempotencyRecord.objects.get(pk=pending.pk).status == Status.PENDING
    assert not LogEntry.objects.exists()


def test_the_confirmation_page_changes_nothing(superuser: Client) -> None:
    failed = records.failed("receipt-3013", shop=True, message=records.message(records.EMAIL, "receipt-3013"))
    page = superuser.get(run_again_url(failed)).content.decode()
    assert "the task body runs again, as a retry would" in page
    assert 'name="csrfmiddlewaretoken"' in page and 'value="Yes, run it again"' in page
    assert IdempotencyRecord.objects.get(pk=failed.pk).status == Status.FAILED
    assert not LogEntry.objects.exists()


# Send again and Run again, with a real outbox task and the Redis broker (no worker).


def queued_ids() -> list[str]:
    return [message["headers"]["id"] for message in queued()]


@pytest.fixture
def redis_broker() -> None:
    if brokers.is_amqp():
        pytest.skip("counts messages in the Redis broker's list")  # the default broker of the suite


@pytest.mark.usefixtures("redis_broker")
def test_send_again_from_the_record_page_republishes_it_and_writes_the_history(
    superuser: Client, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        sent = outbox_effect.delay(1, idempotency_key="order-charge-3020")
    brokers.empty()  # the broker lost the message
    record = IdempotencyRecord.objects.get(key="order-charge-3020")
    confirmation = superuser.get(send_again_url(record)).content.decode()
    assert "under its own task id" in confirmation and 'value="Yes, send it again"' in confirmation
    assert queued_ids() == []  # a GET sends nothing
    response = superuser.post(send_again_url(record), {"post": "yes"}, follow=True)
    assert response.redirect_chain == [(detail(record), 302)]
    assert f"Sent {record} again under its task id {sent.id}." in response.content.decode()
    assert queued_ids() == [sent.id]
    again = IdempotencyRecord.objects.get(pk=record.pk)
    assert (again.status, again.task_id) == (Status.PENDING, sent.id)
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.action_flag, entry.user.get_username()) == (str(record.pk), CHANGE, "root")
    assert entry.change_message == f"Sent again under task id {sent.id}."
    history = reverse("admin:django_idempotent_tasks_idempotencyrecord_history", args=[record.pk])
    assert f"Sent again under task id {sent.id}." in superuser.get(history).content.decode()


@pytest.mark.usefixtures("redis_broker")
def test_run_again_from_the_record_page_resets_the_attempts_under_a_new_task_id(
    superuser: Client, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        first = outbox_failing.delay(5, idempotency_key="receipt-3021")
    brokers.empty()
    IdempotencyRecord.objects.filter(key="receipt-3021").update(status=Status.FAILED, attempts=3)
    record = IdempotencyRecord.objects.get(key="receipt-3021")
    with django_capture_on_commit_callbacks(execute=True):
        response = superuser.post(run_again_url(record), {"post": "yes"}, follow=True)
    again = IdempotencyRecord.objects.get(pk=record.pk)
    assert (again.status, again.attempts) == (Status.PENDING, 0)
    assert again.task_id != first.id
    assert queued_ids() == [again.task_id]
    assert f"runs again under the new task id {again.task_id}" in response.content.decode()
    assert LogEntry.objects.get().change_message == (
        f"Ran again under the new task id {again.task_id} after 3 attempts: the record is PENDING."
    )
    # The page now offers Send again, no longer Run again.
    page = response.content.decode()
    assert "idempotency-send-again" in page and "idempotency-run-again" not in page


@pytest.mark.usefixtures("redis_broker")
def test_the_changelist_actions_send_and_run_again_only_outbox_records(
    superuser: Client, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        pending = [outbox_effect.delay(n, idempotency_key=f"order-charge-303{n}") for n in range(2)]
        outbox_failing.delay(5, idempotency_key="receipt-3040")
    brokers.empty()
    IdempotencyRecord.objects.filter(key="receipt-3040").update(status=Status.FAILED, attempts=3)
    bare = records.failed("receipt-3041", shop=True)
    everything = list(IdempotencyRecord.objects.all())
    page = action(superuser, "send_again_selected", everything).content.decode()
    assert "Sent 2 records again." in page
    assert "2 selected records were not PENDING with a stored outbox message and were left alone." in page
    assert sorted(queued_ids()) == sorted(result.id for result in pending)
    brokers.empty()
    with django_capture_on_commit_callbacks(execute=True):
        page = action(superuser, "run_again_selected", everything).content.decode()
    assert "1 record runs again: it is PENDING, its attempts reset." in page
    assert "3 selected records were not FAILED with a stored outbox message and were left alone." in page
    rerun = IdempotencyRecord.objects.get(key="receipt-3040")
    assert (rerun.status, rerun.attempts, queued_ids()) == (Status.PENDING, 0, [rerun.task_id])
    assert IdempotencyRecord.objects.get(pk=bare.pk).status == Status.FAILED
    assert LogEntry.objects.count() == 3


@pytest.mark.usefixtures("redis_broker")
def test_send_again_of_a_record_a_worker_took_meanwhile_sends_nothing(
    superuser: Client, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        outbox_effect.delay(1, idempotency_key="order-charge-3050")
    brokers.empty()
    record = IdempotencyRecord.objects.get(key="order-charge-3050")
    send_again = outbox.send_again

    def claimed_first(seen: IdempotencyRecord) -> str:
        # A worker claims the key between the page's read and the send.
        IdempotencyRecord.objects.filter(pk=seen.pk).update(status=Status.IN_PROGRESS)
        return send_again(IdempotencyRecord.objects.get(pk=seen.pk))

    monkeypatch.setattr(outbox, "send_again", claimed_first)
    page = superuser.post(send_again_url(record), {"post": "yes"}, follow=True).content.decode()
    assert "Nothing was sent: " in page and "is IN_PROGRESS, not PENDING" in page
    assert queued_ids() == []
    assert not LogEntry.objects.exists()
