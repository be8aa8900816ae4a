"""Counts the replays of each key, for the order page: the records keep no such count."""

from __future__ import annotations

from typing import Any

from django.db.models import F

from django_idempotent_tasks.signals import task_replayed
from shop.models import Replay


def count_replay(sender: Any = None, key: str = "", scope: str = "", **_: Any) -> None:
    Replay.objects.get_or_create(scope=scope, key=key)
    Replay.objects.filter(scope=scope, key=key).update(count=F("count") + 1)


def connect() -> None:
    task_replayed.connect(count_replay, dispatch_uid="shop.count_replay")
