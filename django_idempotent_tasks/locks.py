"""The Redis lock: SET NX PX with a token, Lua compare-and-extend and compare-and-delete."""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django_idempotent_tasks.conf import conf

_EXTEND = """
if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("pexpire", KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
end
return 0
"""


def lock_client() -> Any:
    """The raw redis-py client behind the lock cache (``IDEMPOTENT_TASKS_CACHE``)."""
    from django_redis import get_redis_connection

    return get_redis_connection(conf.CACHE)


def worker_identity() -> str:
    """hostname:pid of this process, stored as the lock token's prefix and on records."""
    return f"{socket.gethostname()}:{os.getpid()}"


class RedisLock:
    """One lock on one Redis key, owned through a random token."""

    def __init__(self, client: Any, name: str, ttl_seconds: int) -> None:
        self.client = client
        self.name = name
        self.ttl_ms = ttl_seconds * 1000
        self.token = f"{worker_identity()}:{uuid.uuid4().hex}"

    def acquire(self) -> bool:
        """Take the lock if nobody holds it (one SET NX PX)."""
        return bool(self.client.set(self.name, self.token, nx=True, px=self.ttl_ms))

    def extend(self) -> bool:
        """Push the expiry out again, only if we still hold the lock."""
        return bool(self.client.eval(_EXTEND, 1, self.name, self.token, self.ttl_ms))

    def release(self) -> bool:
        """Delete the lock, only if we still hold it (never a plain DEL)."""
        return bool(self.client.eval(_RELEASE, 1, self.name, self.token))


def lock_holder(client: Any, name: str) -> str | None:
    """The token of whoever holds the lock now, or None."""
    value = client.get(name)
    return value.decode() if isinstance(value, bytes) else value


class Heartbeat(threading.Thread):
    """Calls ``beat`` every ``interval`` seconds until stopped; ``beat`` returning False ends it.

    ``begin()`` hands it to the process's scheduler, which starts the thread only once the first
    beat is due: a body shorter than ``interval`` never pays for a thread of its own.
    """

    def __init__(self, interval: float, beat: Callable[[], bool]) -> None:
        super().__init__(name="idempotency-heartbeat", daemon=True)
        self.interval = interval
        self.beat = beat
        self.stopping = threading.Event()

    def begin(self) -> None:
        """Start beating ``interval`` seconds from now."""
        _scheduler.schedule(self)

    def run(self) -> None:
        while not self.stopping.is_set() and self.beat() and not self.stopping.wait(self.interval):
            pass

    def stop(self) -> None:
        """Ask the thread to end without waiting for it (it may be blocked on a row lock)."""
        self.stopping.set()


class _Scheduler:
    """One thread per process that starts each heartbeat when its first beat is due."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.due: list[tuple[float, int, Heartbeat]] = []
        self.order = itertools.count()
        self.pid: int | None = None

    def schedule(self, heartbeat: Heartbeat) -> None:
        with self.condition:
            if self.pid != os.getpid():  # first use in this process (or a forked child): no thread yet
                self.pid, self.due = os.getpid(), []
                threading.Thread(target=self.run, name="idempotency-scheduler", daemon=True).start()
            heapq.heappush(self.due, (time.monotonic() + heartbeat.interval, next(self.order), heartbeat))
            self.condition.notify()

    def run(self) -> None:
        while True:
            with self.condition:
                while not self.due or self.due[0][0] > time.monotonic():
                    self.condition.wait(self.due[0][0] - time.monotonic() if self.due else None)
                heartbeat = heapq.heappop(self.due)[2]
            if not heartbeat.stopping.is_set():
                heartbeat.start()


_scheduler = _Scheduler()
