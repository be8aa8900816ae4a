"""Changelist pieces of the admin that stay fast on millions of records: filters and paginator."""

from __future__ import annotations

import re
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Left
from django.db.models.lookups import Exact
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_idempotent_tasks import compat, store
from django_idempotent_tasks.models import IdempotencyRecord

if TYPE_CHECKING:
    _Paginator = Paginator[IdempotencyRecord]
else:
    _Paginator = Paginator

# Walks the (scope, key) unique index one distinct scope at a time (a "loose index scan"):
# SELECT DISTINCT would read every row of a large table to list a dozen task names. MIN() rather
# than ORDER BY … LIMIT 1 in parentheses, which SQLite's grammar refuses; every supported
# database answers MIN() of an index's first column from the index.
_DISTINCT_SCOPES = """
WITH RECURSIVE scopes(scope) AS (
    SELECT MIN(scope) FROM {table}
    UNION ALL
    SELECT (SELECT MIN(scope) FROM {table} WHERE scope > scopes.scope)
    FROM scopes WHERE scopes.scope IS NOT NULL
)
SELECT scope FROM scopes WHERE scope IS NOT NULL LIMIT %s
"""


def _connection() -> Any:
    return connections[store.database()]


def distinct_scopes(limit: int) -> list[str]:
    """The first ``limit`` scopes in use, read through the unique index."""
    connection = _connection()
    table = connection.ops.quote_name(IdempotencyRecord._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(_DISTINCT_SCOPES.format(table=table), [limit])
        return [row[0] for row in cursor.fetchall()]


_ESTIMATES = {
    "postgresql": "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
    # InnoDB's TABLE_ROWS is its sampled estimate, kept by the server without a scan.
    "mysql": "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
}


def estimated_rows() -> int | None:
    """The server's estimate of the table's rows (PostgreSQL, MySQL), or None (SQLite, or never analyzed)."""
    connection = _connection()
    sql = _ESTIMATES.get(connection.vendor)
    if sql is None:
        return None  # SQLite keeps no estimate before ANALYZE: its tables are small enough to count
    with connection.cursor() as cursor:
        cursor.execute(sql, [IdempotencyRecord._meta.db_table])
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None


class RecordChangeList(ChangeList):
    """Leaves the large JSON columns out of the changelist's SELECT."""

    # *args: Django 5.0 added exclude_parameters, which 4.2 does not accept.
    def get_queryset(self, request: HttpRequest, *args: Any, **kwargs: Any) -> QuerySet[Any]:
        queryset = (
            super().get_queryset(request, *args, **kwargs).defer("result", "error", "steps", "attempts_log")
        )
        params = compat.changelist_params(self)
        if params.get(ExpiredFilter.parameter_name) == "yes" and ORDER_VAR not in params:
            # Expired records are the oldest: walking the primary key down from the newest would
            # read most of the table before finding them. Sorting "pk + 0" lets PostgreSQL fetch
            # them through the expires_at index and sort only those.
            queryset = queryset.order_by((F("pk") + 0).desc())
        return queryset


class EstimatedCountPaginator(_Paginator):
    """Counts an unfiltered changelist from the planner's estimate instead of a full COUNT(*)."""

    #: Below this estimate an exact COUNT(*) is cheap, and the estimate may be stale.
    estimate_above = 100_000
    estimated = False

    @cached_property
    def count(self) -> int:
        if compat.is_unfiltered(self.object_list):
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
        matching: QuerySet[IdempotencyRecord] = getattr(store.records(), self.subset)()
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


def _starts_with(field: str, prefix: str) -> Q:
    # SQLite's LIKE ignores ASCII case: the exact comparison of the first characters keeps the
    # search as case-sensitive as the key lookups, and LIKE still narrows the rows first.
    return Q(Exact(Left(field, len(prefix)), prefix), **{f"{field}__startswith": prefix})


def search_condition(term: str) -> Q:
    """What a changelist search matches; exact terms are answered from the (scope, key) index."""
    term = term.strip()
    if term.endswith("*"):
        prefix = term.rstrip("*")
        # LIKE 'prefix%' needs the "C" collation to use a btree index: this reads the table.
        return (
            _starts_with("key", prefix) | _starts_with("task_id", prefix) | _starts_with("task_name", prefix)
        )
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
