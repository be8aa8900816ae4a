"""Changelist pieces of the admin that stay fast on millions of records: filters and paginator."""

from __future__ import annotations

import re
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections, router
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_idempotent_tasks.models import IdempotencyRecord

if TYPE_CHECKING:
    _Paginator = Paginator[IdempotencyRecord]
else:
    _Paginator = Paginator

# Walks the (scope, key) unique index one distinct scope at a time (a "loose index scan"):
# SELECT DISTINCT would read every row of a large table to list a dozen task names.
_DISTINCT_SCOPES = """
WITH RECURSIVE scopes(scope) AS (
    (SELECT scope FROM {table} ORDER BY scope LIMIT 1)
    UNION ALL
    SELECT (SELECT scope FROM {table} WHERE scope > scopes.scope ORDER BY scope LIMIT 1)
    FROM scopes WHERE scopes.scope IS NOT NULL
)
SELECT scope FROM scopes WHERE scope IS NOT NULL LIMIT %s
"""


def _connection() -> Any:
    return connections[router.db_for_read(IdempotencyRecord)]


def distinct_scopes(limit: int) -> list[str]:
    """The first ``limit`` scopes in use, read through the unique index."""
    connection = _connection()
    table = connection.ops.quote_name(IdempotencyRecord._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(_DISTINCT_SCOPES.format(table=table), [limit])
        return [row[0] for row in cursor.fetchall()]


def estimated_rows() -> int | None:
    """PostgreSQL's planner estimate of the table's rows, or None elsewhere or before ANALYZE."""
    connection = _connection()
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            [IdempotencyRecord._meta.db_table],
        )
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None


class EstimatedCountPaginator(_Paginator):
    """Counts an unfiltered changelist from the planner's estimate instead of a full COUNT(*)."""

    #: Below this estimate an exact COUNT(*) is cheap, and the estimate may be stale.
    estimate_above = 100_000
    estimated = False

    @cached_property
    def count(self) -> int:
        query = getattr(self.object_list, "query", None)
        if query is not None and not query.where and not query.distinct:
            estimate = estimated_rows()
            if estimate is not None and estimate > self.estimate_above:
                self.estimated = True
                return estimate
        return super().count


class ScopeFilter(admin.SimpleListFilter):
    """Filter by scope (the task name unless the task sets idempotency_scope)."""

    title = _("task / scope")
    parameter_name = "scope"
    max_choices = 100

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(scope, scope) for scope in distinct_scopes(self.max_choices)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(scope=value) if value else queryset


class _SubsetFilter(admin.SimpleListFilter):
    """Yes: the records of the QuerySet method named ``subset``; no: all the others."""

    subset: str

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        matching: QuerySet[IdempotencyRecord] = getattr(IdempotencyRecord.objects, self.subset)()
        if self.value() == "yes":
            return queryset & matching
        if self.value() == "no":
            return queryset.exclude(pk__in=matching.values("pk"))
        return queryset


class StuckFilter(_SubsetFilter):
    """IN_PROGRESS records whose lease has expired: the holder died or stalled."""

    title = _("stuck")
    parameter_name = subset = "stuck"


class ExpiredFilter(_SubsetFilter):
    """Records past their retention that no live lease protects (what a purge deletes)."""

    title = _("expired")
    parameter_name = subset = "expired"


_UUID = re.compile(r"^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$")
_DOTTED_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
SEARCH_SCOPES = 1000


def search_condition(term: str) -> Q:
    """What a changelist search matches; exact terms are answered from the (scope, key) index."""
    term = term.strip()
    if term.endswith("*"):
        prefix = term.rstrip("*")
        # LIKE 'prefix%' needs the "C" collation to use a btree index: this reads the table.
        return Q(key__startswith=prefix) | Q(task_id__startswith=prefix) | Q(task_name__startswith=prefix)
    scopes = distinct_scopes(SEARCH_SCOPES)
    # key = %s alone cannot use the index, whose first column is scope: name every scope instead.
    condition = Q(key=term) if len(scopes) >= SEARCH_SCOPES else Q(scope__in=scopes, key=term)
    condition |= Q(scope=term)
    for position, char in enumerate(term):
        if char == ":":
            condition |= Q(scope=term[:position], key=term[position + 1 :])
    # Unindexed columns, asked only for terms that look like them: Celery task ids and task names.
    if _UUID.match(term):
        condition |= Q(task_id=term)
    if _DOTTED_NAME.match(term):
        condition |= Q(task_name=term)
    return condition
