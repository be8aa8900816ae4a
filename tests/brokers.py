"""The test broker: Redis (the default) or RabbitMQ (IDEMPOTENT_TESTS_BROKER_URL=amqp://…/<vhost>).

On RabbitMQ the run uses the vhost ``<vhost>-<run id>`` (tests/isolation.py), created and deleted here.
"""

from __future__ import annotations

import subprocess
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from amqp.exceptions import NotFound
from django.conf import settings
from kombu import Connection

#: The queues the suite's tasks are routed to.
QUEUES = ("celery", "chaos")


def is_amqp() -> bool:
    return urlsplit(settings.CELERY_BROKER_URL).scheme in {"amqp", "pyamqp"}


def vhost() -> str:
    return unquote(urlsplit(settings.CELERY_BROKER_URL).path[1:]) or "/"


def _rabbitmqctl(*args: str) -> str:
    done = subprocess.run(["rabbitmqctl", "-s", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"rabbitmqctl {' '.join(args)}: {done.stderr or done.stdout}"
    return done.stdout


def create_vhost() -> None:
    """Create the run's vhost (its name carries the run id) with the URL's user allowed everything."""
    name = vhost()
    if name in _rabbitmqctl("list_vhosts", "name").split():
        # Left by an interrupted run of this checkout: its queues, declared classic or quorum,
        # would fail this run's declarations.
        _rabbitmqctl("delete_vhost", name)
    _rabbitmqctl("add_vhost", name)
    user = urlsplit(settings.CELERY_BROKER_URL).username or "guest"
    _rabbitmqctl("set_permissions", "-p", name, user, ".*", ".*", ".*")


def delete_vhost() -> None:
    _rabbitmqctl("delete_vhost", vhost())


def empty() -> None:
    """Drop every queued message (Redis: the whole broker database)."""
    if not is_amqp():
        redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
        return
    with Connection(settings.CELERY_BROKER_URL, connect_timeout=5) as connection:
        for queue in QUEUES:
            channel: Any = connection.channel()
            try:
                channel.queue_purge(queue)
            except NotFound:
                continue  # not declared yet: nothing queued (and the broker closed the channel)
            channel.close()


def pending() -> int:
    """Messages the broker still holds: queued plus delivered and not yet acknowledged."""
    if not is_amqp():
        broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        return int(broker.llen("celery")) + int(broker.hlen("unacked"))
    rows = _rabbitmqctl("list_queues", "-p", vhost(), "name", "messages").splitlines()
    return sum(int(row.split()[1]) for row in rows if row.split() and row.split()[0] in QUEUES)
