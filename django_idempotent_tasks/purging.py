"""Deleting records in batches (the purge command, the periodic task and the admin's purge): never
a record whose lease is live."""

from __future__ import annotations

from typing import Any

from django_idempotent_tasks import compat


def purgeable(queryset: Any) -> Any:
    """``queryset`` without the IN_PROGRESS records whose lease is live: those are never purged."""
    return queryset.not_live()


def purge(queryset: Any, *, batch_size: int, progress: Any = None) -> int:
    """Delete the records of ``queryset`` in batches, one short transaction each; returns the count."""
    deleted, after = 0, None
    while True:
        page = purgeable(queryset).order_by("pk")
        if after is not None:
            # Walk forward by primary key: restarting from the top would rescan the dead rows of
            # the batches already deleted, which makes a long purge quadratic.
            page = page.filter(pk__gt=after)
        batch = list(page.values_list("pk", flat=True)[:batch_size])
        if not batch:
            return deleted
        after = batch[-1]
        # One DELETE that re-checks the filters and the lease: a delivery may have taken a record
        # over since the SELECT, and PostgreSQL re-evaluates the WHERE on the row it waited for.
        # QuerySet.delete() would, with any pre/post_delete receiver connected, select first and
        # then delete by pk only. Records have no reverse relations, so nothing cascades.
        current = purgeable(queryset.order_by().filter(pk__in=batch))
        deleted += compat.raw_delete(current)
        if progress is not None:
            progress(deleted)
