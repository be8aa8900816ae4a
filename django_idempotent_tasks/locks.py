"""The Redis lock: SET NX PX with a token, Lua compare-and-extend and compare-and-delete."""

from __future__ import annotations

import os
import socket
import uuid
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
