"""The records admin in real headless Chromium (Debian's package) driven by Playwright."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect, sync_playwright

from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import ROOT
from tests.records import operator_scene

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
WIDTH = 1680  # wide enough for every changelist column in the README screenshot
CHANGELIST = "/admin/django_idempotent_tasks/idempotencyrecord/"
# `make screenshots` sets this to docs/images to refresh the README's pictures.
SCREENSHOTS_ENV = "IDEMPOTENT_TESTS_SCREENSHOTS"


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG that is not one flat colour; fails the test otherwise."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    chunks, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        if data[offset + 4 : offset + 8] == b"IDAT":
            chunks.append(data[offset + 8 : offset + 8 + length])
        offset += 12 + length
    assert len(set(zlib.decompress(b"".join(chunks)))) > 16, "the screenshot is blank"
    return width, height


def shoot(page: Page, folder: Path, name: str) -> tuple[int, int]:
    path = folder / name
    page.screenshot(path=str(path), full_page=True)
    return png_size(path.read_bytes())


def rows(page: Page) -> Any:
    return page.locator("#result_list tbody tr")


def test_operator_finds_a_stuck_record_and_purges_expired_ones(live_server: Any, tmp_path: Path) -> None:
    # Every ORM call happens before Playwright starts or after it stops: its sync API runs an
    # event loop in this thread, and Django refuses database access from inside one.
    scene = operator_scene()
    User.objects.create_superuser("operator", "operator@example.com", "correct horse")
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path)
    folder = folder if folder.is_absolute() else ROOT / folder
    folder.mkdir(parents=True, exist_ok=True)
    stuck, expired, result = scene["stuck"], scene["expired"], scene["result"]
    sizes = {}

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": 720})
            page.set_default_timeout(60_000)
            expect.set_options(timeout=60_000)

            page.goto(f"{live_server.url}{CHANGELIST}")
            expect(page).to_have_url(f"{live_server.url}/admin/login/?next={CHANGELIST}")
            page.fill("#id_username", "operator")
            page.fill("#id_password", "correct horse")
            page.click("input[type=submit]")
            expect(rows(page)).to_have_count(len(scene))
            page.click("#toggle-nav-sidebar")  # more room for the columns in the screenshots
            expect(page.locator("#nav-sidebar")).to_be_hidden()
            expect(page.locator(".idempotency-status-stuck")).to_have_text("Stuck")
            expect(page.locator(".paginator")).to_contain_text(f"{len(scene)} idempotency records")
            sizes["changelist"] = shoot(page, folder, "admin-changelist.png")

            page.locator('#changelist-filter details[data-filter-title="stuck"] a', has_text="Yes").click()
            expect(page).to_have_url(f"{live_server.url}{CHANGELIST}?stuck=yes")
            expect(rows(page)).to_have_count(1)
            expect(rows(page).first).to_contain_text(stuck.key)

            page.goto(f"{live_server.url}{CHANGELIST}")
            page.fill("#searchbar", result.key)
            page.press("#searchbar", "Enter")
            expect(rows(page)).to_have_count(1)
            rows(page).first.locator("th a").click()
            expect(page.locator("h2", has_text=str(result))).to_be_visible()
            expect(page.locator(".field-result_json pre")).to_contain_text('"amount_cents": 12900')
            sizes["result"] = shoot(page, folder, "admin-result.png")

            page.goto(f"{live_server.url}{CHANGELIST}?q={stuck.key}")
            rows(page).first.locator("th a").click()
            lease = page.locator(".field-lease_holder")
            expect(lease).to_contain_text(stuck.worker)
            expect(lease).to_contain_text(stuck.task_id)
            expect(lease).to_contain_text("expired: the holder died or stalled")
            expect(page.locator(".field-redis_lock")).to_contain_text("not held")
            expect(page.locator(".field-checkpoints pre")).to_contain_text("reserve_stock")
            sizes["detail"] = shoot(page, folder, "admin-detail.png")

            page.goto(f"{live_server.url}{CHANGELIST}")
            page.click("a.idempotency-purge")
            expect(page.locator(".idempotency-count")).to_have_text(
                "This will delete 1 expired idempotency record."
            )
            expect(page.locator(".idempotency-warning")).to_contain_text("makes its key runnable again")
            page.click("input[type=submit][value='Yes, I’m sure']")
            expect(page).to_have_url(f"{live_server.url}{CHANGELIST}")
            expect(page.locator(".messagelist")).to_contain_text("Deleted 1 record.")
            expect(rows(page)).to_have_count(len(scene) - 1)
            expect(page.locator("#result_list")).not_to_contain_text(expired.key)
        finally:
            browser.close()

    assert [width for width, _height in sizes.values()] == [WIDTH] * 3
    assert all(height >= 720 for _width, height in sizes.values())
    assert not IdempotencyRecord.objects.filter(pk=expired.pk).exists()
    assert IdempotencyRecord.objects.count() == len(scene) - 1
