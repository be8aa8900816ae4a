from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test import TransactionTestCase

from tests import brokers
from tests.celery_app import app as celery_app  # noqa: F401  (binds shared tasks to the test app)
from tests.helpers import Worker


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The topologies start their own PgBouncer, Sentinel and clusters: only ``-m topologies`` runs them."""
    if collection_path.name == "topologies" and "topologies" not in (config.getoption("markexpr") or ""):
        return True
    return None


def _flush_redis() -> None:
    # The run's own Redis databases (tests/isolation.py): no other run uses them.
    for url in (settings.LOCK_REDIS_URL, settings.CELERY_RESULT_BACKEND, settings.CONTROL_REDIS_URL):
        redis.Redis.from_url(url).flushdb()
    brokers.empty()


@pytest.fixture(scope="session", autouse=True)
def broker_vhost() -> Iterator[None]:
    """On RabbitMQ, the run's own vhost: created before the first test, deleted after the last."""
    if not brokers.is_amqp():
        yield
        return
    brokers.create_vhost()
    yield
    brokers.delete_vhost()


@pytest.fixture(autouse=True)
def clean_redis(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("unit") is None:
        request.getfixturevalue("broker_vhost")
        _flush_redis()
    yield


@pytest.fixture
def lock_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.LOCK_REDIS_URL)


#: In /tmp rather than the run's TMPDIR (a tox leg or a CI job may set its own): the servers'
#: connection limits are the machine's.
CROWD_LOCK = "/tmp/django-idempotent-tasks-connection-crowd.lock"


@pytest.fixture
def connection_crowd() -> Iterator[None]:
    """The machine's turn for a test that opens dozens of database connections at once.

    Runs share this machine (make matrix-edges runs two legs side by side, a helper or a second
    clone may run too) and its servers' connection limits (PostgreSQL's max_connections is 100):
    one crowd of 64 fits, a second beside it does not. An exclusive lock on one file keeps those
    tests of every run on this machine from overlapping; the kernel drops it if its holder dies.
    """
    fd = os.open(CROWD_LOCK, os.O_RDONLY | os.O_CREAT, 0o666)  # read-only: another user's file opens too
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and with it the lock


@pytest.fixture(scope="session")
def worker_env(django_db_setup: Any, django_db_blocker: Any) -> dict[str, str]:
    if connection.vendor == "sqlite":
        # WAL (kept in the file): the workers' readers never wait for a writer, nor it for them.
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")
    return {"IDEMPOTENT_TESTS_DATABASE_NAME": connection.settings_dict["NAME"]}


@pytest.fixture(scope="session")
def workers(worker_env: dict[str, str]) -> Iterator[list[Worker]]:
    """Two real prefork workers with two children each, shared by the worker tests."""
    group = [Worker(f"w{n}", worker_env) for n in (1, 2)]
    try:
        for worker in group:
            worker.start()
        yield group
    finally:
        for worker in group:
            worker.stop()


@pytest.fixture
def running_workers(
    workers: list[Worker], worker_env: dict[str, str], transactional_db: Any
) -> Iterator[list[Worker]]:
    """The shared workers, restarted if a test killed one; after the test, the database quiet."""
    for n, worker in enumerate(workers):
        if worker.process is None or worker.process.poll() is not None:
            workers[n] = Worker(worker.name, worker_env).start()
    yield workers
    wait_for_quiet_database()


#: Other sessions on the test database inside a statement or a transaction.
BUSY_SESSIONS = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid() AND state IN ('active', 'idle in transaction')",
    "mysql": "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE()"
    " AND id <> CONNECTION_ID() AND command <> 'Sleep'",
}


def wait_for_quiet_database(timeout: float = 10.0) -> None:
    """Wait (at most ``timeout``) until no worker is writing: a delivery still finishing after the
    test saw its record settle would deadlock with the flush's TRUNCATE that follows the test."""
    sql = BUSY_SESSIONS.get(connection.vendor)
    deadline = time.monotonic() + timeout
    while sql and time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            if cursor.fetchone()[0] == 0:
                return
        time.sleep(0.05)


#: Fixtures that reach the database, Redis or the broker (item.fixturenames holds their closure).
SERVICE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_setup", "live_server", "lock_redis", "broker"}
)
#: Markers of tests that reach a service.
SERVICE_MARKERS = ("django_db", "workers", "browser", "chaos", "explorer", "services")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark ``unit`` (``make unit``) every test that needs no database, Redis or broker."""
    cls = getattr(item, "cls", None)
    if (
        SERVICE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
        and not any(item.get_closest_marker(name) for name in SERVICE_MARKERS)
        and not (cls and issubclass(cls, TransactionTestCase))
    ):
        item.add_marker(pytest.mark.unit)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests that need live workers last: until then nothing consumes the test broker."""
    uses_workers = {id(item) for item in items if "workers" in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: id(item) in uses_workers)
