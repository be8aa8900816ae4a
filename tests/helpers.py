"""Helpers shared by the test modules: polling, worker processes, what the workers did, a dead Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from django.conf import settings
from django.utils import timezone

from tests.testapp.faults import control

if TYPE_CHECKING:
    from django.test import override_settings

    from django_idempotent_tasks.models import IdempotencyRecord

ROOT = Path(__file__).resolve().parent.parent
#: How long a test waits for a real worker to finish a delivery (under load, with redeliveries).
SETTLE_TIMEOUT = 90
#: How long a test waits for a body to start on a real worker.
START_TIMEOUT = 60
#: Nothing listens on port 1: every command to this Redis is refused at once.
DEAD_REDIS_URL = "redis://127.0.0.1:1/0"
REFUSED = "Error 111 connecting to 127.0.0.1:1. Connection refused"
#: Added to a wait for a lease to run out, for the clocks of two processes to agree it has.
CLOCK_MARGIN = 0.5


def wait_for(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Worker:
    """A real ``celery worker -P prefork`` process of the test app."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        concurrency: int = 2,
        app: str = "tests.celery_app",
        extra: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.env = env
        self.concurrency = concurrency
        self.app = app
        self.extra = extra
        self.log = Path(tempfile.mkdtemp(prefix="idem-worker-")) / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        self.log_file = self.log.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                self.app,
                "worker",
                "-P",
                "prefork",
                "-c",
                str(self.concurrency),
                "--prefetch-multiplier",
                "1",
                "-n",
                f"{self.name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "INFO",
                *self.extra,
            ],
            cwd=ROOT,
            env={**os.environ, **self.env},
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(
            lambda: "ready." in self.output() or self.process.poll() is not None,  # type: ignore[union-attr]
            timeout=60,
            what=f"worker {self.name} to start",
        )
        assert self.process.poll() is None, f"worker {self.name} exited:\n{self.output()[-3000:]}"
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def stop(self) -> None:
        """Warm shutdown; SIGKILL the process group if it takes longer than 15 s."""
        if self.process is not None and self.process.poll() is None:
            # The main process alone: it ends its children itself, so they exit (and save their
            # coverage data) instead of dying of the signal.
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log_file.close()

    def kill(self) -> None:
        """SIGKILL the main process and its children."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(timeout=15)
        self.log_file.close()


def redis_down() -> override_settings:
    """The lock cache pointed at ``DEAD_REDIS_URL``: a ``with`` block in which Redis refuses everything."""
    from django.test import override_settings

    locks: Any = settings.CACHES["locks"]
    dead = {**locks, "LOCATION": DEAD_REDIS_URL}
    return override_settings(CACHES={**settings.CACHES, "locks": dead})


# What the real workers did, read from the database and from what the receivers of
# tests/testapp/tasks.py keep in the control Redis: tests assert on these, never on log lines.


def finished(key: str, status: str = "SUCCEEDED", timeout: float = SETTLE_TIMEOUT) -> IdempotencyRecord:
    """The record of ``key`` once it is in ``status``."""
    from django_idempotent_tasks.models import IdempotencyRecord

    done: IdempotencyRecord = wait_for(
        lambda: IdempotencyRecord.objects.filter(key=key, status=status).first(),
        timeout=timeout,
        what=f"{key} to be {status}",
    )
    return done


def outlive_lease(key: str) -> None:
    """Wait past the lease of ``key`` as it stands now: only a renewal keeps it live afterwards."""
    from django_idempotent_tasks.models import IdempotencyRecord

    until = IdempotencyRecord.objects.get(key=key).lease_expires_at
    assert until is not None, f"{key} holds no lease"
    time.sleep(max(0.0, (until - timezone.now()).total_seconds()) + CLOCK_MARGIN)


def lapsed(scope: str, key: str) -> None:
    """Wait until the lease and the Redis lock of ``key`` have both run out (its holder is paused)."""
    from django_idempotent_tasks import keys
    from django_idempotent_tasks.models import IdempotencyRecord

    lock = redis.Redis.from_url(settings.LOCK_REDIS_URL)

    def gone() -> bool:
        record = IdempotencyRecord.objects.get(key=key)
        return not record.lease_is_live and not lock.exists(keys.lock_name(scope, key))

    wait_for(gone, timeout=START_TIMEOUT, what=f"the lease and the lock of {key} to run out")
    time.sleep(CLOCK_MARGIN)


def settled(key: str, timeout: float = SETTLE_TIMEOUT) -> IdempotencyRecord:
    """The record of ``key`` once it is no longer IN_PROGRESS, whatever it became."""
    from django_idempotent_tasks.models import IdempotencyRecord

    done: IdempotencyRecord = wait_for(
        lambda: IdempotencyRecord.objects.exclude(status="IN_PROGRESS").filter(key=key).first(),
        timeout=timeout,
        what=f"{key} to settle",
    )
    return done


def body_pid(key: str) -> int:
    """The pid of the process running the body of ``key``, once it started."""
    pid = wait_for(lambda: control().get(f"pid:{key}"), timeout=START_TIMEOUT, what=f"{key}'s body to start")
    return int(pid)


def calls(key: str) -> int:
    """How many times a body of ``key`` made its external call (survives rollbacks)."""
    return int(control().get(f"calls:{key}") or 0)


def replays(key: str) -> int:
    """How many deliveries of ``key`` replayed the stored result (signal task_replayed)."""
    return int(control().get(f"replayed:{key}") or 0)


def replayed_on(key: str) -> list[str]:
    """The worker (``-n`` name) of each replay of ``key``."""
    return _listed(f"replayed_on:{key}")


def conflicts(key: str) -> list[str]:
    """The ``on_conflict`` action of each delivery of ``key`` that found it held (signal lock_conflict)."""
    return _listed(f"conflicts:{key}")


def leases_lost(key: str) -> list[int]:
    """The fence of each holder of ``key`` that found its lease lost (signal lease_lost)."""
    return [int(fence) for fence in _listed(f"lease_lost:{key}")]


def errors(key: str) -> list[str]:
    """The exception type of each failure or retry Celery reported for ``key``."""
    return _listed(f"errors:{key}")


def _listed(name: str) -> list[str]:
    items: list[bytes] = control().lrange(name, 0, -1)  # type: ignore[assignment]
    return [item.decode() for item in items]
