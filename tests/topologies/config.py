"""Where the topologies' processes listen, and the Django settings that reach them (workers and docs alike)."""

from __future__ import annotations

import os
from typing import Any

#: Every process of the topologies listens on a port of BASE .. BASE + 39 (TOPOLOGIES_PORT_BASE).
BASE = int(os.environ.get("TOPOLOGIES_PORT_BASE", "6500"))
PGBOUNCER = BASE
PRIMARY, STANDBY, REPLICATION_PROXY = BASE + 10, BASE + 11, BASE + 12
PARTITION_PROXY = BASE + 20
REDIS_MASTER = BASE + 30  # and its replica on BASE + 31
SENTINEL = BASE + 35  # three sentinels: BASE + 35 .. 37
SENTINEL_SERVICE = "topologies"

# What docs/deployment.md asks of every PostgreSQL connection: connecting and idle waits bounded
# (libpq's connect_timeout, TCP keepalives and TCP_USER_TIMEOUT, all shorter than the lease).
BOUNDED_CONNECTION = {
    "connect_timeout": 3,
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 2,
    "tcp_user_timeout": 4000,
}


def pgbouncer_database(port: int, alias: str) -> dict[str, Any]:
    """PgBouncer in transaction pooling: client-side binding (Django's default), no server-side cursors."""
    return {
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "NAME": alias,
        "DISABLE_SERVER_SIDE_CURSORS": True,
        "OPTIONS": dict(BOUNDED_CONNECTION),
    }


def multi_host_database(ports: list[int], name: str) -> dict[str, Any]:
    """libpq multi-host: whichever of the servers accepts writes now."""
    return {
        "HOST": ",".join("127.0.0.1" for _ in ports),
        "PORT": ",".join(str(port) for port in ports),
        "NAME": name,
        "OPTIONS": {**BOUNDED_CONNECTION, "target_session_attrs": "read-write"},
    }


def direct_database(port: int, name: str) -> dict[str, Any]:
    return {"HOST": "127.0.0.1", "PORT": str(port), "NAME": name, "OPTIONS": dict(BOUNDED_CONNECTION)}


def sentinel_cache(ports: list[int], service: str = SENTINEL_SERVICE) -> dict[str, Any]:
    """The lock cache through django-redis's Sentinel client: the master is asked of the sentinels."""
    timeouts = {"socket_timeout": 2, "socket_connect_timeout": 2}
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{service}/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": [("127.0.0.1", port) for port in ports],
            "SENTINEL_KWARGS": timeouts,
            "SOCKET_CONNECT_TIMEOUT": 2,
            "SOCKET_TIMEOUT": 2,
        },
    }
