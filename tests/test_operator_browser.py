"""The operator's questions in real headless Chromium at 1366x768: every column on screen, times to
the second, the attempts, a wrapped traceback, release from the record's page."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from playwright.sync_api import Page, ViewportSize, expect, sync_playwright

from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import ROOT
from tests.records import TRACEBACK, failed, operator_scene
from tests.test_browser import CHANGELIST, CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS_ENV, rows, shoot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SCREEN: ViewportSize = {"width": 1366, "height": 768}
# A traceback whose lines are far wider than the screen: a long path and a long message.
WIDE_TRACEBACK = TRACEBACK.replace(
    "Connection unexpectedly closed",
    "Connection unexpectedly closed by smtp-relay-eu-west-1.internal.example.com:587 " + "x" * 300,
)


def overflow(page: Page) -> int:
    """How many pixels the page, or the changelist's own scrolling box, is wider than it shows (0:
    no horizontal scroll bar anywhere)."""
    width: int = page.evaluate(
        """() => Math.max(0, ...[document.documentElement, ...document.querySelectorAll('.results')]
            .map(box => box.scrollWidth - box.clientWidth))"""
    )
    return width


def detail_of(page: Page, url: str, key: str) -> None:
    page.goto(f"{url}{CHANGELIST}?q={key}")
    rows(page).first.locator("th a").click()


def test_the_operator_answers_was_it_charged_twice_at_1366(live_server: Any, tmp_path: Path) -> None:
    scene = operator_scene()
    broken = failed(
        "receipt-order-1008",
        shop=True,
        error={"type": "SMTPServerDisconnected", "message": "x", "traceback": WIDE_TRACEBACK},
    )
    User.objects.create_superuser("operator", "operator@example.com", "correct horse")
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path)
    folder = folder if folder.is_absolute() else ROOT / folder
    folder.mkdir(parents=True, exist_ok=True)
    recovered, stuck = scene["succeeded"], scene["stuck"]
    widths: dict[str, int] = {}

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

            # Every column on screen with both sidebars open, the times to the second.
            expect(rows(page)).to_have_count(len(scene) + 1)
            expect(page.locator("#nav-sidebar")).to_be_visible()
            expect(page.locator("#result_list thead")).to_contain_text("Completed")
            expect(page.locator("#result_list td.field-created").first).to_have_text(
                re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
            )
            widths["changelist"] = overflow(page)
            last = page.locator("#result_list thead th").last.bounding_box()
            assert last is not None and last["x"] + last["width"] <= SCREEN["width"]
            shoot(page, folder, "admin-changelist-1366.png")

            # "Was order 1003 charged twice?": the record tells its two attempts.
            detail_of(page, live_server.url, recovered.key)
            history = page.locator(".field-attempts_history table.idempotency-history")
            expect(history.locator("tbody tr")).to_have_count(2)
            expect(history.locator("tbody tr").nth(0)).to_contain_text(
                "attempt 1 on worker-1.example.internal:4242 died mid-body and was taken over"
            )
            expect(history.locator("tbody tr").nth(1)).to_contain_text(
                "attempt 2 on worker-2.example.internal:5151 recovered and completed after 0.3 s"
            )
            widths["history"] = overflow(page)
            shoot(page, folder, "admin-history.png")

            # A traceback wider than the screen wraps inside the page.
            detail_of(page, live_server.url, broken.key)
            traceback = page.locator(".field-error_details pre")
            expect(traceback).to_contain_text("smtp-relay-eu-west-1")
            assert traceback.evaluate("pre => pre.scrollWidth <= pre.clientWidth")
            widths["traceback"] = overflow(page)
            shoot(page, folder, "admin-traceback.png")

            # Release from the stuck record's page: a confirmation, then a POST.
            detail_of(page, live_server.url, stuck.key)
            page.click("a.idempotency-release")
            expect(page.locator(".idempotency-warning")).to_contain_text("A broker may still hold")
            widths["release"] = overflow(page)
            shoot(page, folder, "admin-release.png")
            page.click("input[type=submit][value='Yes, release it']")
            expect(page.locator(".messagelist")).to_contain_text("Released the stuck lease of")
            expect(page.locator(".field-status_badge")).to_contain_text("Failed")
            expect(page.locator(".field-attempts_history")).to_contain_text("was released by an operator")
            expect(page.locator("a.idempotency-release")).to_have_count(0)
            page.click("a.historylink")
            expect(page.locator("#change-history")).to_contain_text("Released the stuck lease of fence")
        finally:
            browser.close()

    assert widths == {"changelist": 0, "history": 0, "traceback": 0, "release": 0}
    assert IdempotencyRecord.objects.get(pk=stuck.pk).status == IdempotencyRecord.Status.FAILED
    assert LogEntry.objects.get().object_id == str(stuck.pk)
