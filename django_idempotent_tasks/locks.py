"""The Redis lock: SET NX PX with a token, Lua compare-and-extend and compare-and-delete."""

from __future__ import annotations

import functools
import os
import secrets
import socket
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_idempotent_tasks.conf import conf
from django_idempotent_tasks.exceptions import IdempotencyConfigurationError

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


LOCK_CACHE_HINT = (
    'Add a cache with "BACKEND": "django_redis.cache.RedisCache" to CACHES and name it in '
    "IDEMPOTENT_TASKS_CACHE."
)


def lock_cache_problem(alias: str) -> str | None:
    """What is wrong with the lock cache ``alias`` (check E001's message), or None if it is django-redis."""
    named = (
        "IDEMPOTENT_TASKS_CACHE is"
        if hasattr(settings, "IDEMPOTENT_TASKS_CACHE")
        else ("IDEMPOTENT_TASKS_CACHE is not set, so the lock cache is")
    )
    if alias not in settings.CACHES:
        return f"{named} {alias!r}, but CACHES has no such cache."
    cache: Any = settings.CACHES[alias]
    backend = str(cache.get("BACKEND", ""))
    if backend.startswith("django_redis."):
        return None
    if backend == "django.core.cache.backends.redis.RedisCache":
        return (
            f"{named} {alias!r}, which is Django's built-in RedisCache ({backend!r}): the locks need "
            "django-redis (its raw client runs their Lua scripts)."
        )
    return f"{named} {alias!r}, which is not a django-redis cache (backend {backend!r})."


# The lock cache's alias, checked, and its raw client: one per process, as redis-py's clients are
# thread-safe (looking it up through Django's per-thread caches on every delivery cost more CPU
# than a Redis command's own client code).
_verified: tuple[str, Any] | None = None


@receiver(setting_changed)
def _forget_verified(setting: str, **kwargs: Any) -> None:
    global _verified
    if setting in ("CACHES", "IDEMPOTENT_TASKS_CACHE"):
        _verified = None


def lock_client() -> Any:
    """The raw redis-py client behind the lock cache (``IDEMPOTENT_TASKS_CACHE``)."""
    global _verified
    from django_redis import get_redis_connection

    alias = conf.CACHE
    if _verified is None or _verified[0] != alias:
        # Workers never run the system checks: the first delivery that needs the lock says what
        # E001 would have said, instead of django-redis's NotImplementedError or a KeyError.
        problem = lock_cache_problem(alias)
        if problem is not None:
            raise IdempotencyConfigurationError(f"{problem} {LOCK_CACHE_HINT}")
        _verified = (alias, get_redis_connection(alias))
    return _verified[1]


@functools.cache
def worker_identity() -> str:
    """hostname:pid of this process, stored as the lock token's prefix and on records."""
    return f"{socket.gethostname()}:{os.getpid()}"


os.register_at_fork(after_in_child=worker_identity.cache_clear)  # a forked child has its own pid


class RedisLock:
    """One lock on one Redis key, owned through a random token."""

    def __init__(self, client: Any, name: str, ttl_seconds: int) -> None:
        self.client = client
        self.name = name
        self.ttl_ms = ttl_seconds * 1000
        self.token = f"{worker_identity()}:{secrets.token_hex(16)}"

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
