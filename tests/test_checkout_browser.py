"""The example shop in real Chromium: a double-clicked Pay button makes one order and one charge."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
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


@dataclass(frozen=True)
class Shop:
    url: str
    database: Path
    server_log: Path

    def posts(self) -> int:
        """The checkout POSTs runserver answered."""
        return self.server_log.read_text().count('"POST / HTTP/1.1"')


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
def shop(tmp_path: Path) -> Iterator[Shop]:
    """The example project served by runserver, with one real worker, on a fresh SQLite database."""
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
    server = start([*manage, "runserver", "--noreload", f"127.0.0.1:{port}"], env, tmp_path / "server.log")
    worker_log = tmp_path / "worker.log"
    worker_command = [sys.executable, "-m", "celery", "-A", "example_project", "worker", "-P", "solo"]
    worker = start([*worker_command, "--without-gossip", "--without-mingle", "-l", "INFO"], env, worker_log)
    try:
        wait_for(lambda: " ready." in worker_log.read_text(), SETTLE_TIMEOUT, "the worker")
        wait_for(lambda: _answers(port), SETTLE_TIMEOUT, "runserver")
        yield Shop(f"http://127.0.0.1:{port}", database, tmp_path / "server.log")
    finally:
        stop(server)
        stop(worker)


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def count(database: Path, sql: str) -> int:
    with sqlite3.connect(database) as connection:
        return int(connection.execute(sql).fetchone()[0])


def test_a_double_clicked_pay_button_makes_one_order_and_one_charge(shop: Shop) -> None:
    posts: list[str] = []  # the bodies of the form's POSTs
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
            # Chromium itself drops some second clicks while the first POST is under way, so the
            # resent POST below is what makes sure the server sees the same attempt more than once.
            page.dblclick("button[type=submit]", delay=50)
            expect(page).to_have_url(f"{shop.url}/orders/1/", timeout=60_000)
            first_confirmation = page.locator("h1").inner_text()
            # A browser retry or a reloaded POST: the same form, sent once more, finds the same order.
            again = page.request.post(
                f"{shop.url}/",
                data=posts[0],
                headers={"Content-Type": "application/x-www-form-urlencoded", "Referer": f"{shop.url}/"},
            )
            assert again.url == f"{shop.url}/orders/1/", again.url
        finally:
            browser.close()

    assert shop.posts() >= 2, shop.server_log.read_text()
    assert first_confirmation == "Order 1"
    charged = "SELECT COUNT(*) FROM django_idempotent_tasks_idempotencyrecord WHERE status = 'SUCCEEDED'"
    wait_for(lambda: count(shop.database, charged) == 2, SETTLE_TIMEOUT, "the charge and the e-mail")
    assert count(shop.database, "SELECT COUNT(*) FROM shop_order") == 1
    assert count(shop.database, "SELECT COUNT(*) FROM shop_charge") == 1
