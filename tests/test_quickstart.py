"""The README's Quickstart, run as pasted: its blocks, read from README.md, in a new startproject project."""

from __future__ import annotations

import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
import redis

from tests.helpers import ROOT, wait_for
from tests.settings import REDIS_URL

pytestmark = pytest.mark.workers

#: ``<!-- quickstart: ACTION [PATH] -->`` on the line before a fenced block names what to do with it.
MARKER = re.compile(r"^(\s*)<!-- quickstart: (run|shell|append|write)(?: (\S+))? -->$")
#: The Quickstart's Redis databases, moved to the suite's Redis and to databases no other test uses.
REDIS_DATABASES = {"0": "9", "1": "10"}


def quickstart_blocks(readme: Path = ROOT / "README.md") -> list[tuple[str, str | None, str]]:
    """(action, path, text) of every marked block of ``readme``, in order, dedented."""
    lines = readme.read_text().splitlines()
    blocks = []
    for number, line in enumerate(lines):
        marked = MARKER.match(line)
        if not marked:
            continue
        indent, action, path = marked.groups()
        fence = lines[number + 1]
        assert fence.startswith(f"{indent}```"), (
            f"README.md:{number + 2}: a fenced block must follow the marker"
        )
        end = lines.index(f"{indent}```", number + 2)
        text = "\n".join(code[len(indent) :] for code in lines[number + 2 : end])
        blocks.append((action, path, text + "\n"))
    return blocks


def local(text: str) -> str:
    """``text`` with the Quickstart's Redis URLs pointed at the suite's Redis."""
    return re.sub(
        r"redis://127\.0\.0\.1:6379/(\d)", lambda found: f"{REDIS_URL}/{REDIS_DATABASES[found[1]]}", text
    )


def flush_redis() -> None:
    for database in REDIS_DATABASES.values():
        redis.Redis.from_url(f"{REDIS_URL}/{database}").flushdb()


class Shell:
    """Runs the Quickstart's commands as a user's shell would, in the venv, from a temporary directory."""

    def __init__(self, directory: Path) -> None:
        self.cwd = directory
        env = {name: value for name, value in os.environ.items() if not name.startswith("DJANGO_")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        self.env = env
        self.worker: subprocess.Popen[bytes] | None = None
        self.worker_log = directory / "worker.log"

    def run(self, line: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            line,
            shell=True,
            cwd=self.cwd,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{line!r} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    def command(self, line: str) -> None:
        if line.startswith("pip install"):
            assert '"celery[redis]"' in line  # the venv has both already: nothing new is installed
        elif line.startswith("cd "):
            self.cwd = self.cwd / line[3:].strip()
        elif line.startswith("celery "):
            with self.worker_log.open("wb") as log:
                self.worker = subprocess.Popen(
                    shlex.split(line),
                    cwd=self.cwd,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            try:
                wait_for(lambda: "ready." in self.log() or self.worker.poll() is not None, 60, "the worker")  # type: ignore[union-attr]
            except AssertionError as exc:
                raise AssertionError(f"no 'ready.' line from the worker:\n{self.log()[-3000:]}") from exc
            assert self.worker.poll() is None, f"the worker exited:\n{self.log()}"
        else:
            self.run(line)

    def log(self) -> str:
        return self.worker_log.read_text(errors="replace") if self.worker_log.exists() else ""

    def stop_worker(self) -> None:
        if self.worker is None or self.worker.poll() is not None:
            return
        os.kill(self.worker.pid, signal.SIGTERM)  # warm shutdown: the main process ends its children
        try:
            self.worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.worker.pid, signal.SIGKILL)
            self.worker.wait(timeout=20)


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    flush_redis()
    user = Shell(tmp_path)
    try:
        yield user
    finally:
        user.stop_worker()
        flush_redis()


def build_quickstart(shell: Shell, settings: str = "", calls: str = "") -> None:
    """Run the README's Quickstart in ``shell``: ``settings`` added to the project's, ``calls`` to its shell step."""
    blocks = quickstart_blocks()
    assert [action for action, _, _ in blocks].count("shell") == 1
    for action, path, text in blocks:
        if action == "run":
            for line in text.splitlines():
                shell.command(line)
        elif action == "shell":
            shell.run("python manage.py shell", stdin=text + calls)
        else:
            target = shell.cwd / str(path)
            if action == "append":
                assert target.exists(), f"{path} is not a file startproject or startapp wrote"
                extra = settings if path == "shop/settings.py" else ""
                target.write_text(target.read_text() + "\n" + local(text) + extra)
            else:  # a new file, or one replacing what startproject or startapp wrote
                target.write_text(local(text))
    assert shell.worker is not None, "the Quickstart starts no worker"


def test_the_quickstart_runs_as_pasted_and_replays(shell: Shell) -> None:
    build_quickstart(shell)
    wait_for(lambda: shell.log().count("succeeded in") >= 2, 90, "both deliveries to finish")
    # closing(): a connection's own with-block only commits (Python 3.13 warns of it unclosed).
    with closing(sqlite3.connect(shell.cwd / "db.sqlite3")) as database:
        charges = database.execute("SELECT order_id, amount_cents FROM orders_charge").fetchall()
        records = database.execute(
            "SELECT key, status FROM django_idempotent_tasks_idempotencyrecord"
        ).fetchall()
    assert charges == [(42, 1000)]  # the body ran once
    assert records == [("order-charge-42", "SUCCEEDED")]
    assert "already succeeded; replaying the stored result" in shell.log()

    # The settings pass the checks; --deploy asks only what production must choose.
    assert "System check identified no issues" in shell.run("python manage.py check")
    # (Django 6.1 makes one of those choices an error, the mail backend: list it, do not fail on it.)
    deploy = shell.run("python manage.py check --deploy --fail-level CRITICAL")
    assert set(re.findall(r"\(([\w.]+\.[EW]\d+)\)", deploy)) <= {
        "mail.E001",  # MAILERS (Django 6.1+): startproject's console backend
        "security.W004",  # SECURE_HSTS_SECONDS
        "security.W008",  # SECURE_SSL_REDIRECT
        "security.W009",  # SECRET_KEY
        "security.W012",  # SESSION_COOKIE_SECURE
        "security.W016",  # CSRF_COOKIE_SECURE
        "security.W018",  # DEBUG
        "security.W020",  # ALLOWED_HOSTS
    }, deploy


def doc_block(path: Path, name: str) -> str:
    """The fenced block after ``<!-- recipe: NAME -->`` in ``path``."""
    lines = path.read_text().splitlines()
    start = lines.index(f"<!-- recipe: {name} -->") + 2
    return "\n".join(lines[start : lines.index("```", start)]) + "\n"


def test_the_logging_recipe_keeps_celerys_lines_and_prints_ours_once(shell: Shell) -> None:
    # docs/observability.md's LOGGING, in the Quickstart's project; a third call fails in the body.
    recipe = doc_block(ROOT / "docs" / "observability.md", "logging")
    build_quickstart(
        shell, settings="\n" + recipe, calls='charge_customer.delay("x", 1, idempotency_key="bad")\n'
    )
    wait_for(
        lambda: "raised unexpected" in shell.log() and shell.log().count("succeeded in") >= 2, 90, "the calls"
    )
    log = shell.log()
    assert log.count(" ready.") == 1
    assert log.count("succeeded in") == 2
    assert log.count("raised unexpected: ValueError") == 1
    ours = [
        line for line in log.splitlines() if "orders.tasks.charge_customer[" in line and " Task " not in line
    ]
    assert sum("already succeeded; replaying the stored result" in line for line in ours) == 1
    assert sum("[bad] failed with ValueError" in line for line in ours) == 1
    # Each of the package's lines once, through the recipe's formatter (not again through Celery's).
    assert ours and all("outcome=" in line for line in ours), ours
