"""The explorer's probe in a worker: every I/O of a delivery is a boundary, found at run time.

Nothing here names a statement or a command of the package: SQL is seen through Django's
``execute_wrappers`` (and ``commit``), lock Redis commands through redis-py's ``execute_command``,
and each is labelled by its shape and the package function on the stack, so a new statement in
store.py or a new command in locks.py becomes a new boundary without an edit here.

At each boundary the probe appends ``<id> <pid>`` to ``explore:trace:<key>`` on the control Redis;
when the harness armed that boundary for the key, the probe reports where it is and waits until
the harness has struck (it may never wake up: that is the point).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import django_idempotent_tasks
from tests.chaos.checker import text
from tests.testapp.faults import control

PACKAGE = str(Path(django_idempotent_tasks.__file__).resolve().parent)
TASKS = str(Path(__file__).resolve().parent / "tasks.py")
# How long a struck process waits for the harness to finish its fault before it goes on.
STRIKE_WAIT = 60


class _Current:
    key: str | None = None  # the key of the delivery this (prefork child) process runs


current = _Current()


def boundary_id(io: str, label: str, n: int, phase: str) -> str:
    return f"{io}:{label}#{n}:{phase}"


def point(io: str, label: str, phase: str, key: str | None = None, n: int | None = None) -> int:
    """Pass one boundary: trace it, and strike if the harness armed it. Returns its occurrence."""
    key = key or current.key
    if key is None:
        return 0
    client = control()
    if n is None:
        n = int(client.hincrby(f"explore:count:{key}", f"{io}:{label}", 1))
    bid = boundary_id(io, label, n, phase)
    client.rpush(f"explore:trace:{key}", f"{bid} {os.getpid()}")
    armed = client.get(f"explore:arm:{key}")
    if armed is not None and text(armed).split()[0] == bid and client.delete(f"explore:arm:{key}"):
        _strike(client, key, bid)
    return n


@contextmanager
def around(io: str, label: str, key: str | None = None) -> Iterator[None]:
    """The boundaries before and after one I/O call."""
    n = point(io, label, "before", key)
    yield
    if n:
        point(io, label, "after", key, n)


def _strike(client: Any, key: str, bid: str) -> None:
    backend, port = _database_session()
    hit = {"pid": os.getpid(), "boundary": bid, "backend": backend, "port": port}
    client.set(f"explore:hit:{key}", json.dumps(hit))
    client.blpop([f"explore:go:{key}"], timeout=STRIKE_WAIT)


def _database_session() -> tuple[int | None, int | None]:
    """This thread's database backend id and the local TCP port of its socket (None: not open)."""
    from django.db import connection

    raw = connection.connection
    if raw is None:
        return None, None
    if connection.vendor == "postgresql":
        return int(raw.info.backend_pid), _local_port(raw.pgconn.socket)
    return int(raw.thread_id()), _local_port(raw.fileno())


def _local_port(fileno: int) -> int | None:
    """The local TCP port of the socket ``fileno`` (None: a Unix socket)."""
    sock = socket.socket(fileno=os.dup(fileno))
    try:
        return int(sock.getsockname()[1]) if sock.family == socket.AF_INET else None
    finally:
        sock.close()


def owner(module_file: str | None = None, outermost_wins: bool = True) -> str:
    """Who made this call: ``body`` (the test task's own code), else the outermost frame in
    ``module_file`` (the transition, e.g. ``store.complete`` rather than its helper; the innermost
    one with ``outermost_wins=False``), else the innermost package frame."""
    frame: Any = sys._getframe(2)
    outermost = innermost = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename == TASKS and innermost is None:
            return "body"
        if filename.startswith(PACKAGE):
            name = f"{Path(filename).stem}.{frame.f_code.co_name}"
            innermost = innermost or name
            if module_file is not None and filename.endswith(module_file):
                outermost = name if outermost_wins or outermost is None else outermost
        frame = frame.f_back
    return outermost or innermost or "other"


def sql_shape(sql: str) -> str:
    words = sql.split()
    return words[0].upper() if words else "EMPTY"


def _sql_wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    with around("sql", f"{sql_shape(sql)}@{owner('store.py')}"):
        return execute(sql, params, many, context)


def _add_wrapper(sender: Any, connection: Any, **kwargs: Any) -> None:
    if _sql_wrapper not in connection.execute_wrappers:
        connection.execute_wrappers.append(_sql_wrapper)


def install() -> None:
    """Instrument this process (called once when the explorer's Celery app is imported)."""
    import redis
    from celery.signals import task_postrun, task_prerun
    from celery.worker.request import Request
    from django.conf import settings
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.signals import connection_created

    from django_idempotent_tasks.idempotency import Idempotency

    connection_created.connect(_add_wrapper, weak=False)
    commit = BaseDatabaseWrapper.commit

    def wrapped_commit(self: Any) -> None:
        with around("sql", f"COMMIT@{owner('store.py')}"):
            commit(self)

    BaseDatabaseWrapper.commit = wrapped_commit  # type: ignore[method-assign]
    lock_url = urlsplit(settings.LOCK_REDIS_URL)
    lock_address = (lock_url.port or 6379, int(lock_url.path.lstrip("/") or 0))
    execute_command: Any = redis.Redis.execute_command

    def wrapped_execute(self: Any, *args: Any, **options: Any) -> Any:
        kwargs = self.connection_pool.connection_kwargs
        if (kwargs.get("port"), int(kwargs.get("db") or 0)) != lock_address:
            return execute_command(self, *args, **options)
        with around("redis", f"{args[0]}@{owner('locks.py', outermost_wins=False)}"):
            return execute_command(self, *args, **options)

    redis.Redis.execute_command = wrapped_execute  # type: ignore[method-assign]
    step = Idempotency.step

    def wrapped_step(self: Any, name: str, fn: Any = None) -> Any:
        with around("step", name):
            return step(self, name, fn)

    Idempotency.step = wrapped_step  # type: ignore[method-assign]
    acknowledge = Request.acknowledge

    def wrapped_acknowledge(self: Any) -> None:
        key = (self.kwargs or {}).get("idempotency_key") if isinstance(self.kwargs, dict) else None
        with around("celery", "ack", key=key):
            acknowledge(self)

    Request.acknowledge = wrapped_acknowledge  # type: ignore[method-assign]
    task_prerun.connect(_prerun, weak=False)
    task_postrun.connect(_postrun, weak=False)


def _prerun(kwargs: Any = None, **extra: Any) -> None:
    current.key = kwargs.get("idempotency_key") if isinstance(kwargs, dict) else None
    point("celery", "prerun", "after")


def _postrun(**extra: Any) -> None:
    with suppress(Exception):
        point("celery", "return", "after")
    current.key = None
