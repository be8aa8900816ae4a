"""What keeps one test run apart from the others on a machine: its id, its database names, its Redis.

Imported by ``tests/settings.py``, so it imports nothing from Django or the package. A run never
wipes what it did not create: its databases carry the run id, its Redis is a ``redis-server`` of
its own (or the one ``IDEMPOTENT_TESTS_REDIS_URL`` hands over), its RabbitMQ vhost carries the id.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_id() -> str:
    """The run's id: ``IDEMPOTENT_TESTS_RUN_ID``, else a hash of the checkout and the Python environment."""
    # Stable across runs of one checkout and one virtualenv (--reuse-db finds its database again),
    # different for a second clone or a tox leg; two runs at once in one checkout and one
    # environment need IDEMPOTENT_TESTS_RUN_ID set apart.
    given = os.environ.get("IDEMPOTENT_TESTS_RUN_ID")
    if given:
        return given
    derived = hashlib.sha256(f"{ROOT}\0{sys.prefix}".encode()).hexdigest()[:6]
    # Worker subprocesses inherit it: they compute the same names even if started from elsewhere.
    os.environ["IDEMPOTENT_TESTS_RUN_ID"] = derived
    return derived


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _die_with_parent() -> None:
    # Linux: the server gets SIGTERM when the test process dies, even of SIGKILL; elsewhere, atexit.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class PrivateRedis:
    """A ``redis-server`` for one run: no persistence, a free port, stopped when the run ends."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="idem-tests-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> PrivateRedis:
        # Another process may take the port between our probe and the server's bind: try again.
        for _ in range(5):
            self.port = free_port()
            command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            command += ["--appendonly", "no", "--dir", str(self.dir), "--logfile", "redis.log"]
            self.process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent
            )
            if self._wait_ready():
                atexit.register(self.stop)
                return self
        raise RuntimeError(f"could not start redis-server; see {self.dir / 'redis.log'}")

    def _wait_ready(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2) as conn,
            ):
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return True
            time.sleep(0.02)
        self.stop()
        return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def redis_url() -> str:
    """The run's Redis server (no database number): given, private to a pytest run, or ``REDIS_URL``."""
    # IDEMPOTENT_TESTS_REDIS_URL hands the run a server it may wipe (databases 5 to 14 are
    # flushed). Otherwise a pytest run starts a redis-server of its own and exports its URL for the
    # workers it starts; any other import (makemigrations in make lint) gets REDIS_URL, unused.
    given = os.environ.get("IDEMPOTENT_TESTS_REDIS_URL")
    if given:
        return given.rstrip("/")
    if "pytest" not in sys.modules:
        return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
    if shutil.which("redis-server") is None:
        raise RuntimeError(
            "The tests start a redis-server of their own: install it (apt-get install redis-server) "
            "or set IDEMPOTENT_TESTS_REDIS_URL to a Redis server the run may wipe."
        )
    url = PrivateRedis().start().url
    os.environ["IDEMPOTENT_TESTS_REDIS_URL"] = url
    return url


def test_database_name(name: str) -> str:
    """pytest-django's database name for this run (``test_<NAME>_<run id>``)."""
    return f"test_{name}_{run_id()}"


def vhost_url(url: str) -> str:
    """An amqp:// broker URL with the run id added to its vhost (``<vhost>-<run id>``)."""
    scheme, _, rest = url.partition("://")
    server, _, vhost = rest.partition("/")
    return f"{scheme}://{server}/{vhost.strip('/') or 'idempotent-tests'}-{run_id()}"
