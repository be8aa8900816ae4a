"""The admin answers the operator's questions: the attempts, times to the second, release on the
record's page."""

from __future__ import annotations

from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_idempotent_tasks import store
from django_idempotent_tasks.models import IdempotencyRecord
from tests import records
from tests.admin_pages import queries_of
from tests.test_admin import CHANGELIST, detail, login, staff

pytestmark = pytest.mark.django_db
Status = IdempotencyRecord.Status
MOMENT = datetime(2026, 12, 3, 7, 54, 9, tzinfo=dt_timezone.utc)


def release_url(record: IdempotencyRecord) -> str:
    return reverse("admin:django_idempotent_tasks_idempotencyrecord_release", args=[record.pk])


@pytest.fixture
def superuser() -> Client:
    return login(User.objects.create_superuser("root", "root@example.com", None))


def test_the_detail_page_tells_each_attempt(superuser: Client) -> None:
    record = records.make("order-44", shop=True, fence=2, attempts=2, attempts_log=records.recovered_log())
    page = superuser.get(detail(record)).content.decode()
    assert (
        "attempt 1 on worker-1.example.internal:4242 died mid-body and was taken over 64.0 s after it began"
        in page
    )
    assert "attempt 2 on worker-2.example.internal:5151 recovered and completed after 0.3 s" in page
    assert '<table class="idempotency-history">' in page
    assert "No attempt recorded." in superuser.get(detail(records.make("k", shop=True))).content.decode()


def test_times_show_to_the_second(superuser: Client) -> None:
    record = records.make("order-45", shop=True, created_at=MOMENT, completed_at=MOMENT, expires_at=MOMENT)
    listing = superuser.get(CHANGELIST).content.decode()
    folded = '<span style="white-space:nowrap">2026-12-03</span> <span style="white-space:nowrap">07:54:09 UTC</span>'
    assert listing.count(folded) == 2  # created and completed; the expiry is on the record's page
    page = superuser.get(detail(record)).content.decode()
    assert page.count("2026-12-03 07:54:09 UTC") == 3  # created, completed, expires


def test_release_from_the_detail_page_confirms_then_releases(superuser: Client) -> None:
    stuck = records.stuck("order-46", shop=True)
    page = superuser.get(detail(stuck)).content.decode()
    assert f'href="{release_url(stuck)}" class="idempotency-release"' in page

    confirmation = superuser.get(release_url(stuck)).content.decode()
    assert "A broker may still hold this key’s message" in confirmation
    assert 'name="csrfmiddlewaretoken"' in confirmation
    assert IdempotencyRecord.objects.get(pk=stuck.pk).status == Status.IN_PROGRESS  # a GET changes nothing

    response = superuser.post(release_url(stuck), {"post": "yes"}, follow=True)
    assert response.redirect_chain == [(detail(stuck), 302)]
    assert "Released the stuck lease of" in response.content.decode()
    released = IdempotencyRecord.objects.get(pk=stuck.pk)
    assert released.status == Status.FAILED
    assert released.attempts_log[-1]["event"] == "released"
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.action_flag, entry.user.get_username()) == (str(stuck.pk), CHANGE, "root")
    assert entry.change_message == f"Released the stuck lease of fence {stuck.fence}: the record is FAILED."


def test_release_needs_the_permission_and_a_csrf_token() -> None:
    stuck = records.stuck("order-47", shop=True)
    viewer = login(staff("viewer", "view_idempotencyrecord"))
    assert "idempotency-release" not in viewer.get(detail(stuck)).content.decode()
    assert viewer.get(release_url(stuck)).status_code == 403
    assert viewer.post(release_url(stuck), {"post": "yes"}).status_code == 403
    oncall = login(staff("oncall", "view_idempotencyrecord", "release_lease"), enforce_csrf_checks=True)
    assert oncall.post(release_url(stuck), {"post": "yes"}).status_code == 403  # no CSRF token
    assert IdempotencyRecord.objects.get(pk=stuck.pk).status == Status.IN_PROGRESS
    assert not LogEntry.objects.exists()


def test_release_leaves_a_record_that_is_not_stuck_alone(superuser: Client) -> None:
    live = records.live("order-48", shop=True)
    assert "idempotency-release" not in superuser.get(detail(live)).content.decode()
    response = superuser.post(release_url(live), {"post": "yes"}, follow=True)
    assert "is not stuck" in response.content.decode()
    assert IdempotencyRecord.objects.get(pk=live.pk).status == Status.IN_PROGRESS
    missing = reverse("admin:django_idempotent_tasks_idempotencyrecord_release", args=[live.pk + 1000])
    assert superuser.get(missing).status_code == 404


def test_the_changelist_leaves_the_attempts_log_out(superuser: Client) -> None:
    records.make("order-49", shop=True, attempts_log=records.recovered_log())
    _page, queries = queries_of(superuser, CHANGELIST)
    selects = [sql for sql in queries if "idempotencyrecord" in sql and sql.startswith("SELECT")]
    assert selects and not any("attempts_log" in sql for sql in selects)


def test_release_leaves_a_record_taken_over_after_the_page_read_it(
    superuser: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    stuck = records.stuck("order-50", shop=True)
    release = store.release_lease

    def taken_over_first(seen: IdempotencyRecord, by: str, **kwargs: Any) -> bool:
        # A redelivery claims the key between the page's read and its fenced write.
        IdempotencyRecord.objects.filter(pk=seen.pk).update(claim_token=store.new_token())  # a new claim
        return release(seen, by, **kwargs)

    monkeypatch.setattr(store, "release_lease", taken_over_first)
    page = superuser.post(release_url(stuck), {"post": "yes"}, follow=True).content.decode()
    assert "was taken over or finished meanwhile: nothing was changed." in page
    assert IdempotencyRecord.objects.get(pk=stuck.pk).status == Status.IN_PROGRESS
    assert not LogEntry.objects.exists()
