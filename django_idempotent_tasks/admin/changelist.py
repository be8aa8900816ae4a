"""Changelist pieces of the admin that stay fast on millions of records: filters and paginator."""

from __future__ import annotations

import json
import re
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import F, Q, QuerySet, Value
from django.db.models.functions import Left, StrIndex
from django.db.models.lookups import Exact, GreaterThan
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_idempotent_tasks import compat, store
from django_idempotent_tasks.models import SCOPE_LIMIT, IdempotencyRecord

if TYPE_CHECKING:
    _Paginator = Paginator[IdempotencyRecord]
else:
    _Paginator = Paginator


def _connection() -> Any:
    return connections[store.database()]


def distinct_scopes(limit: int) -> list[str]:
    """The first ``limit`` scopes in use, read through the unique index."""
    scopes: list[str] = store.records().scopes(limit)
    return scopes


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
        expired = params.get(ExpiredFilter.parameter_name) == "yes"
        exact_search = bool(self.query.strip()) and "*" not in self.query
        if (expired or exact_search or "created_at__day" in params) and ORDER_VAR not in params:
            # Expired records are the oldest, a day long past lies deep in the table and a key
            # anywhere: walking the primary key down from the newest would read most of it before
            # finding them. Sorting "pk + 0" fetches them through the expires_at, created_at or
            # (scope, key) index instead and sorts only those (the same order).
            queryset = queryset.order_by((F("pk") + 0).desc())
        return queryset


def planned_rows(queryset: QuerySet[Any]) -> int | None:
    """The planner's estimate of the rows of ``queryset`` (PostgreSQL, MySQL), or None (SQLite)."""
    connection = _connection()
    if connection.vendor not in ("postgresql", "mysql"):
        return None
    sql, params = queryset.order_by().query.sql_with_params()
    explain = "EXPLAIN (FORMAT JSON) " if connection.vendor == "postgresql" else "EXPLAIN "
    with connection.cursor() as cursor:
        cursor.execute(explain + sql, params)
        if connection.vendor == "postgresql":
            plan = cursor.fetchone()[0]
            return int((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]["Plan Rows"])
        columns = [column[0] for column in cursor.description]
        row = dict(zip(columns, cursor.fetchone(), strict=True))
    if row.get("rows") is None:
        return None
    return int(int(row["rows"]) * float(row.get("filtered") or 100) / 100)


class EstimatedCountPaginator(_Paginator):
    """Counts a changelist exactly up to ``estimate_above`` records, and from the planner's estimate past it."""

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
        if _connection().vendor == "sqlite":
            return super().count  # no estimate to fall back on; SQLite counts a million index rows fast
        # A filter matching most of a large table would be counted row by row: count no further
        # than the estimate threshold, then ask the planner.
        queryset: QuerySet[Any] = self.object_list  # type: ignore[assignment]
        bounded = queryset.order_by()[: self.estimate_above + 1].count()
        if bounded <= self.estimate_above:
            return bounded
        estimate = planned_rows(queryset)
        if estimate is None:
            return super().count
        self.estimated = True
        return max(estimate, bounded)


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
_UUID_PREFIX = re.compile(r"^[0-9a-fA-F-]+$")
_NAME_PREFIX = re.compile(r"^[A-Za-z_][\w.]*$")
SEARCH_SCOPES = SCOPE_LIMIT


_CODE_POINT_COLLATIONS = {"C", "POSIX", "C.UTF-8", "C.utf8", "ucs_basic"}


def _sorts_by_code_point(connection: Any) -> bool:
    """Whether text columns without a collation of their own sort by code point on ``connection``."""
    if connection.vendor != "postgresql":
        return True  # SQLite's BINARY, and the binary collation of scope and key on MySQL
    known = getattr(connection, "_idempotent_code_point_order", None)
    if known is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT datcollate FROM pg_database WHERE datname = current_database()")
            known = cursor.fetchone()[0] in _CODE_POINT_COLLATIONS
        connection._idempotent_code_point_order = known
    return bool(known)


def _starts_with(field: str, prefix: str, ranged: bool) -> Q:
    # SQLite's LIKE ignores ASCII case: the exact comparison of the first characters keeps the
    # search as case-sensitive as the key lookups, and LIKE still narrows the rows first.
    condition = Q(Exact(Left(field, len(prefix)), prefix), **{f"{field}__startswith": prefix})
    if ranged and prefix[-1] < chr(0x10FFFF):
        # An index serves LIKE 'prefix%' only under PostgreSQL's "C" collation and never SQLite's
        # case-blind LIKE; a range serves it wherever the column sorts by code point.
        condition &= Q(**{f"{field}__gte": prefix, f"{field}__lt": prefix[:-1] + chr(ord(prefix[-1]) + 1)})
    return condition


def _contains(field: str, text: str) -> Q:
    # StrIndex (strpos, instr) keeps SQLite's search case-sensitive, as in _starts_with.
    return Q(GreaterThan(StrIndex(field, Value(text)), 0), **{f"{field}__contains": text})


def search_condition(term: str) -> Q:
    """What a changelist search matches; exact terms and key prefixes are answered from the (scope, key) index."""
    term = term.strip()
    if term.startswith("*"):
        # No index serves a search inside the values: this reads every record.
        text = term.strip("*")
        return _contains("key", text) | _contains("task_id", text) | _contains("task_name", text)
    scopes = distinct_scopes(SEARCH_SCOPES)
    in_scope = Q() if len(scopes) >= SEARCH_SCOPES else Q(scope__in=scopes)
    if term.endswith("*"):
        prefix = term.rstrip("*")
        connection = _connection()
        ranged = _sorts_by_code_point(connection)
        condition = in_scope & _starts_with("key", prefix, ranged)
        # MySQL's default collations fold case: only scope and key compare by code point there.
        ranged = ranged and connection.vendor != "mysql"
        # Unindexed columns, asked only for prefixes that can begin them (as for exact terms below).
        if _UUID_PREFIX.match(prefix):
            condition |= _starts_with("task_id", prefix, ranged)
        if _NAME_PREFIX.match(prefix):
            condition |= _starts_with("task_name", prefix, ranged)
        return condition
    # key = %s alone cannot use the index, whose first column is scope: name every scope instead.
    condition = in_scope & Q(key=term)
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
