"""Deleting records in batches (the purge command, the periodic task and the admin's purge): never
a record whose lease is live."""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from django_idempotent_tasks import compat


def purgeable(queryset: Any) -> Any:
    """``queryset`` without the IN_PROGRESS records whose lease is live and the PENDING ones (a
    message on its way, or lost and waiting for the re-drive): those are never purged."""
    return queryset.not_live().exclude(status="PENDING")


def purge(queryset: Any, *, batch_size: int, progress: Any = None) -> int:
    """Delete the records of ``queryset`` in batches, one short transaction each; returns the count."""
    # Walk the expires_at index forward: expired records are found where they are, however their
    # ids are spread, and the walk ends at the last of them instead of reading the rest of the
    # table. A restart from the top would rescan the dead rows of the batches already deleted.
    deleted, after = 0, None
    while True:
        page = purgeable(queryset).filter(expires_at__isnull=False).order_by("expires_at", "pk")
        if after is not None:
            expiry, pk = after
            page = page.filter(
                Q(expires_at__gt=expiry) | Q(expires_at=expiry, pk__gt=pk), expires_at__gte=expiry
            )
        batch = list(page.values_list("expires_at", "pk")[:batch_size])
        deleted += _delete(queryset, [pk for _, pk in batch], progress, deleted)
        if len(batch) < batch_size:
            break  # nothing further matched: a new record expiring meanwhile waits for the next purge
        after = batch[-1]
    # Records without an expiry (deliveries always set one): by primary key, from the index's NULLs.
    after_pk = None
    while True:
        page = purgeable(queryset).filter(expires_at=None).order_by("pk")
        if after_pk is not None:
            page = page.filter(pk__gt=after_pk)
        pks = list(page.values_list("pk", flat=True)[:batch_size])
        deleted += _delete(queryset, pks, progress, deleted)
        if len(pks) < batch_size:
            return deleted
        after_pk = pks[-1]


def _delete(queryset: Any, pks: list[Any], progress: Any, deleted: int) -> int:
    """Delete the records of ``pks`` that ``queryset`` still matches; returns how many."""
    if not pks:
        return 0
    # One DELETE that re-checks the filters and the lease: a delivery may have taken a record
    # over since the SELECT, and PostgreSQL re-evaluates the WHERE on the row it waited for.
    # QuerySet.delete() would, with any pre/post_delete receiver connected, select first and
    # then delete by pk only. Records have no reverse relations, so nothing cascades.
    count = compat.raw_delete(purgeable(queryset.order_by().filter(pk__in=pks)))
    if progress is not None:
        progress(deleted + count)
    return count
