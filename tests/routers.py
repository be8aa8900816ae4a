"""The database router of the router tests: the records are read from "replica", written to "default"."""

from __future__ import annotations

from typing import Any


class ReplicaRouter:
    """Reads of idempotency records go to the replica, as a read-replica setup routes them."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "replica" if model._meta.app_label == "django_idempotent_tasks" else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "default"
