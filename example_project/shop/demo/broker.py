"""What the demo reads from and writes to the Redis broker: pending messages and re-publishing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis
from celery import current_app
from celery.signals import before_task_publish
from django.conf import settings

# kombu's Redis transport keeps delivered, unacknowledged messages in this hash (tag -> message).
UNACKED, UNACKED_INDEX = "unacked", "unacked_index"


def client() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def _unacked_tags(broker: redis.Redis, queue: str) -> list[bytes]:
    tags = []
    for tag, raw in broker.hscan_iter(UNACKED):
        _message, _exchange, routing_key = json.loads(raw)
        if routing_key == queue:
            tags.append(tag)
    return tags


def pending(queue: str) -> int:
    """Messages of ``queue`` still waiting, or delivered and not yet acknowledged."""
    broker = client()
    try:
        return int(broker.llen(queue)) + len(_unacked_tags(broker, queue))
    finally:
        broker.close()


def reset(queue: str) -> None:
    """Drop the messages an earlier, interrupted run may have left in ``queue``."""
    broker = client()
    try:
        broker.delete(queue)
        for tag in _unacked_tags(broker, queue):
            broker.hdel(UNACKED, tag)
            broker.zrem(UNACKED_INDEX, tag)
    finally:
        broker.close()


@dataclass
class Published:
    """A task message as it was handed to the broker."""

    body: Any
    exchange: str
    routing_key: str
    headers: dict[str, Any]
    properties: dict[str, Any]


class Recorder:
    """Keeps a copy of every task message this process publishes, by task id."""

    def __init__(self) -> None:
        self.messages: dict[str, Published] = {}

    def __enter__(self) -> Recorder:
        before_task_publish.connect(self._record, weak=False)
        return self

    def __exit__(self, *exc: object) -> None:
        before_task_publish.disconnect(self._record)

    def _record(
        self,
        body: Any = None,
        exchange: str = "",
        routing_key: str = "",
        headers: Any = None,
        properties: Any = None,
        **_: Any,
    ) -> None:
        headers = dict(headers or {})
        self.messages[headers["id"]] = Published(body, exchange, routing_key, headers, dict(properties or {}))

    def republish(self, task_id: str) -> None:
        """Publish the same message again, as an operator replaying a dead-letter queue does."""
        message = self.messages[task_id]
        with current_app.producer_pool.acquire(block=True) as producer:
            producer.publish(
                message.body,
                exchange=message.exchange,
                routing_key=message.routing_key,
                headers=message.headers,
                serializer="json",
                **message.properties,
            )
