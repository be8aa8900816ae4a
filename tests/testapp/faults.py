"""Kill points armed per key in a control Redis database; each fires once (GETDEL)."""

from __future__ import annotations

import os
import signal

import redis
from django.conf import settings

_client: redis.Redis | None = None


def control() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.CONTROL_REDIS_URL)
    return _client


def arm(point: str, key: str) -> None:
    """Make the next process reaching ``point`` for ``key`` SIGKILL itself."""
    control().set(f"kill:{point}:{key}", "1")


def reached(point: str, key: str) -> None:
    """SIGKILL this process if ``point`` is armed for ``key``."""
    if control().getdel(f"kill:{point}:{key}"):
        os.kill(os.getpid(), signal.SIGKILL)
