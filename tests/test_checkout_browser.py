"""The example shop in real Chromium: a double-clicked Pay button makes one order and one charge."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings
from playwright.sync_api import expect, sync_playwright

from tests.helpers import ROOT, wait_for
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = [pytest.mark.browser, pytest.mark.workers]

PROJECT = ROOT / "example_project"
SHOP_REDIS_DB = 8  # the shop uses databases 8 (broker), 9 (locks) and 10 (results) of REDIS_URL
SETTLE_TIMEOUT = 60  # seconds for the worker to start and run both tasks of the order
HOLD_FIRST_POST = 30  # at most, seconds the first POST of a double click waits for the second


@dataclass(frozen=True)
class Shop:
    url: str
    database: Path
    posts_file: Path
    env: dict[str, str]

    def posts(self) -> list[str]:
        """The checkout key of each checkout POST that reached the server, in order of arrival."""
        return self.posts_file.read_text().splitlines() if self.posts_file.exists() else []

    def manage(self, *args: str) -> None:
        subprocess.run(
            [sys.executable, "manage.py", *args], cwd=PROJECT, env=self.env, check=True, timeout=120
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=PROJECT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def shop(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Shop]:
    """The example project served by runserver, with one real worker, on a fresh SQLite database.

    Parametrized (indirect) with a number of seconds, runserver holds the first checkout POST that
    long or until a second one arrives (tests/shop_server.py).
    """
    database = tmp_path / "shop.sqlite3"
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    env.update(
        REDIS_URL=f"{settings.REDIS_URL}/{SHOP_REDIS_DB}",
        DATABASE_URL=f"sqlite:///{database}",
        PYTHONUNBUFFERED="1",
        COVERAGE_FILE=str(ROOT / ".coverage"),
    )
    for offset in range(3):
        redis.Redis.from_url(f"{settings.REDIS_URL}/{SHOP_REDIS_DB + offset}").flushdb()
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=PROJECT, env=env, check=True, timeout=120)
    port = free_port()
    # runserver with the shop's settings plus tests/shop_server.py's middleware (tests/shop_settings.py).
    server_env = {**env, "DJANGO_SETTINGS_MODULE": "tests.shop_settings", "PYTHONPATH": str(ROOT)}
    server_env["SHOP_POSTS_FILE"] = str(tmp_path / "posts.txt")
    server_env["SHOP_HOLD_FIRST_POST"] = str(getattr(request, "param", 0))
    server_command = [*manage, "runserver", "--noreload", f"127.0.0.1:{port}"]
    server = start(server_command, server_env, tmp_path / "server.log")
    worker_log = tmp_path / "worker.log"
    worker_command = [sys.executable, "-m", "celery", "-A", "example_project", "worker", "-P", "solo"]
    worker = start([*worker_command, "--without-gossip", "--without-mingle", "-l", "INFO"], env, worker_log)
    try:
        wait_for(lambda: " ready." in worker_log.read_text(), SETTLE_TIMEOUT, "the worker")
        wait_for(lambda: _answers(port), SETTLE_TIMEOUT, "runserver")
        yield Shop(f"http://127.0.0.1:{port}", database, tmp_path / "posts.txt", env)
    finally:
        stop(server)
        stop(worker)


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def count(database: Path, sql: str) -> int:
    with closing(sqlite3.connect(database)) as connection:  # its own with-block does not close it
        return int(connection.execute(sql).fetchone()[0])


CHARGED = "SELECT COUNT(*) FROM django_idempotent_tasks_idempotencyrecord WHERE status = 'SUCCEEDED'"
REPLAYS = "SELECT COALESCE(SUM(count), 0) FROM shop_replay WHERE key = 'order-1-charge'"


@pytest.mark.parametrize("shop", [HOLD_FIRST_POST], indirect=True)
def test_a_double_clicked_pay_button_makes_one_order_and_one_charge(shop: Shop) -> None:
    posts: list[str] = []  # the bodies of the form's POSTs, as the browser sent them
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.set_default_timeout(60_000)
            page.on(
                "request",
                lambda request: posts.append(request.post_data or "") if request.method == "POST" else None,
            )
            page.goto(f"{shop.url}/")
            # The server holds the first POST until the second arrives: both clicks reach it.
            page.dblclick("button[type=submit]", delay=50)
            expect(page).to_have_url(f"{shop.url}/orders/1/", timeout=60_000)
            confirmation = page.locator("h1").inner_text()
            # A reload of the POST (or a browser retry): the same body sent again finds the same order.
            again = page.request.post(
                f"{shop.url}/",
                data=posts[0],
                headers={"Content-Type": "application/x-www-form-urlencoded", "Referer": f"{shop.url}/"},
            )
            assert again.url == f"{shop.url}/orders/1/", again.url
            assert "<h1>Order 1</h1>" in again.text()
        finally:
            browser.close()

    assert len(posts) == 2, posts  # the browser sent both clicks
    # and the server received them and the reload, all three with the one key the form was rendered with
    assert len(shop.posts()) == 3 and len(set(shop.posts())) == 1, shop.posts()
    assert confirmation == "Order 1"
    wait_for(lambda: count(shop.database, CHARGED) == 2, SETTLE_TIMEOUT, "the charge and the e-mail")
    assert count(shop.database, "SELECT COUNT(*) FROM shop_order") == 1
    assert count(shop.database, "SELECT COUNT(*) FROM shop_charge") == 1


def test_the_order_page_shows_its_records_with_their_replays(shop: Shop) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{shop.url}/")
            page.click("button[type=submit]")
            expect(page).to_have_url(f"{shop.url}/orders/1/", timeout=60_000)
            wait_for(lambda: count(shop.database, CHARGED) == 2, SETTLE_TIMEOUT, "the charge and the e-mail")
            # The charge's message delivered once more, as after a lost ack: a replay.
            send = "from shop.tasks import charge_customer_idempotent as t; t.delay(1, idempotency_key='order-1-charge')"
            shop.manage("shell", "-c", send)
            wait_for(lambda: count(shop.database, REPLAYS) == 1, SETTLE_TIMEOUT, "the replay")
            page.reload()
            rows = page.locator("#records tr")
            expect(rows).to_have_count(3)  # the header, the charge's record and the e-mail's
            charge = rows.filter(has_text="order-1-charge")
            cells = [charge.locator(f"td.{name}").inner_text() for name in ("status", "attempts", "replays")]
            link = charge.locator("a").get_attribute("href")
            email_replays = rows.filter(has_text="order-1-email").locator("td.replays").inner_text()
        finally:
            browser.close()

    assert cells == ["SUCCEEDED", "1", "1"]
    pk = count(
        shop.database, "SELECT id FROM django_idempotent_tasks_idempotencyrecord WHERE key = 'order-1-charge'"
    )
    assert link == f"/admin/django_idempotent_tasks/idempotencyrecord/{pk}/change/"
    assert email_replays == "0"
