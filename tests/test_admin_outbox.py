"""The admin's outbox records: PENDING listed with its age, Send again and Run again, each a POST
with a History entry, refused without the permission, a CSRF token or a stored message."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_idempotent_tasks.models import IdempotencyRecord
from tests import records
from tests.admin_pages import listed_keys, queries_of
from tests.test_admin import CHANGELIST, detail, login, staff

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
    selects = [sql for sql in many if "idempotencyrecord" in sql and sql.startswith("SELECT")]
    assert not any(connection.ops.quote_name("message") in sql for sql in selects)


def test_the_detail_page_tells_the_age_and_shows_the_stored_message(
    superuser: Client, settings: object
) -> None:
    fresh = records.pending("order-charge-3003", age=30, shop=True)
    page = superuser.get(detail(fresh)).content.decode()
    assert (
        "Pending for 30 s: on its way to a worker. The re-drive sends it again once it is 600 s old." in page
    )
    assert "&quot;idempotency_key&quot;: &quot;order-charge-3003&quot;" in page
    late = records.pending("order-charge-3004", age=3 * 3600, shop=True)
    page = superuser.get(detail(late)).content.decode()
    assert "Pending for 3 h, past the re-drive age (600 s): no worker has taken it." in page
    assert "redrive_idempotency_records" in page


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
