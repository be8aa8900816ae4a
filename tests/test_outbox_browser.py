"""Send again and Run again in real headless Chromium: a PENDING record whose message the broker
lost is sent again, a FAILED one runs again; the record's new state and its History entry are seen."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect, sync_playwright

from django_idempotent_tasks.models import IdempotencyRecord
from tests import brokers
from tests.test_browser import CHANGELIST, CHROMIUM, CHROMIUM_ARGS, rows
from tests.test_operator_browser import SCREEN
from tests.test_outbox import queued
from tests.testapp.tasks import outbox_effect, outbox_failing

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
Status = IdempotencyRecord.Status


def open_record(page: Page, url: str, key: str) -> None:
    page.goto(f"{url}{CHANGELIST}?q={key}")
    rows(page).first.locator("th a").click()


def test_send_again_and_run_again_from_the_record_pages(live_server: Any) -> None:
    if brokers.is_amqp():
        pytest.skip("counts messages in the Redis broker's list")  # the default broker of the suite
    # Every ORM call happens before Playwright starts or after it stops (see tests/test_browser.py).
    lost = outbox_effect.delay(1, idempotency_key="order-charge-4001")  # autocommit: published at once
    outbox_failing.delay(5, idempotency_key="receipt-4002")
    brokers.empty()  # the broker dropped both messages
    IdempotencyRecord.objects.filter(key="receipt-4002").update(status=Status.FAILED, attempts=3)
    User.objects.create_superuser("operator", "operator@example.com", "correct horse")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport=SCREEN)
            page.set_default_timeout(60_000)
            expect.set_options(timeout=60_000)
            page.goto(f"{live_server.url}{CHANGELIST}")
            page.fill("#id_username", "operator")
            page.fill("#id_password", "correct horse")
            page.click("input[type=submit]")
            expect(page.locator(".idempotency-status-pending")).to_have_text(
                re.compile(r"^Pending \d+ (s|min)$")
            )

            # The PENDING record whose message was lost: Send again, confirmed, under its task id.
            open_record(page, live_server.url, "order-charge-4001")
            expect(page.locator(".field-outbox_state")).to_contain_text("on its way to a worker")
            page.click("a.idempotency-send-again")
            expect(page.locator(".idempotency-warning")).to_contain_text("under its own task id")
            page.click("input[type=submit][value='Yes, send it again']")
            expect(page.locator(".messagelist")).to_contain_text(f"again under its task id {lost.id}")
            expect(page.locator(".field-status_badge")).to_contain_text("Pending")
            page.click("a.historylink")
            expect(page.locator("#change-history")).to_contain_text(f"Sent again under task id {lost.id}.")

            # The FAILED record: Run again, confirmed; it is PENDING again, with its attempts reset.
            open_record(page, live_server.url, "receipt-4002")
            expect(page.locator(".field-attempts")).to_contain_text("3")
            expect(page.locator("a.idempotency-send-again")).to_have_count(0)
            page.click("a.idempotency-run-again")
            expect(page.locator(".idempotency-warning")).to_contain_text("attempts reset")
            page.click("input[type=submit][value='Yes, run it again']")
            expect(page.locator(".messagelist")).to_contain_text("runs again under the new task id")
            expect(page.locator(".field-status_badge")).to_contain_text("Pending")
            expect(page.locator(".field-attempts")).to_contain_text("0")
            expect(page.locator("a.idempotency-run-again")).to_have_count(0)
            expect(page.locator("a.idempotency-send-again")).to_have_count(1)
            page.click("a.historylink")
            expect(page.locator("#change-history")).to_contain_text("Ran again under the new task id")
        finally:
            browser.close()

    rerun = IdempotencyRecord.objects.get(key="receipt-4002")
    assert (rerun.status, rerun.attempts) == (Status.PENDING, 0)
    assert sorted(message["headers"]["id"] for message in queued()) == sorted([lost.id, rerun.task_id])
    entries = LogEntry.objects.order_by("pk")
    assert [(entry.action_flag, entry.user.get_username()) for entry in entries] == [(CHANGE, "operator")] * 2
