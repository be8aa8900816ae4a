"""The delivery path's SQL, precompiled once per database, and its values prepared and decoded by
the record's own fields, as the ORM would: building a queryset or a model instance per call cost
more CPU than the round trip itself (BENCHMARKS.md)."""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, models

from django_idempotent_tasks import history
from django_idempotent_tasks.models import IdempotencyRecord, later_sql


def field(name: str) -> models.Field[Any, Any]:
    meta = IdempotencyRecord._meta
    return meta.pk if name == "pk" else meta.get_field(name)  # type: ignore[return-value]


def column(name: str) -> str:
    found = field(name)
    return found.column or found.name


def _table(alias: str) -> str:
    return connections[alias].ops.quote_name(IdempotencyRecord._meta.db_table)


@functools.cache
def select_sql(alias: str, names: tuple[str, ...], *where: str) -> str:
    """``SELECT names FROM records WHERE where[0] = %s AND …``."""
    quote = connections[alias].ops.quote_name
    columns = ", ".join(quote(column(name)) for name in names)
    condition = " AND ".join(f"{quote(column(name))} = %s" for name in where)
    return f"SELECT {columns} FROM {_table(alias)} WHERE {condition}"


@functools.cache
def insert_sql(
    alias: str,
    values: tuple[str, ...],
    clocked: tuple[str, ...],
    event: tuple[str, ...] = (),
    fixed: tuple[tuple[str, Any], ...] = (),
) -> tuple[str, bool]:
    """``INSERT`` of the columns ``values`` (parameters), ``fixed`` (name and constant, written in
    the statement: see ``literal``) and ``clocked`` (the database clock plus a parameter's seconds
    each), and whether it returns the new primary key itself (RETURNING) rather than through the
    cursor. A non-empty ``event`` starts the attempts log with an event of those fields (parameters
    after the clocked ones)."""
    connection = connections[alias]
    quote, clock = connection.ops.quote_name, later_sql(connection.vendor)
    logged = ("attempts_log",) if event else ()
    named = (*values, *(name for name, _ in fixed), *clocked, *logged)
    columns = ", ".join(quote(column(name)) for name in named)
    placeholders = ", ".join(
        [
            *("%s" for _ in values),
            *(literal(constant) for _, constant in fixed),
            *(clock for _ in clocked),
            *(history.first_sql(connection.vendor, event) for _ in logged),
        ]
    )
    sql = f"INSERT INTO {_table(alias)} ({columns}) VALUES ({placeholders})"
    returning = bool(connection.features.can_return_columns_from_insert)
    if returning:
        # Written out rather than through ops.return_insert_columns, which Django 6.1 renamed.
        sql += f" RETURNING {quote(column('pk'))}"
    return sql, returning


def literal(constant: Any) -> str:
    """SQL text of a constant every claim writes: NULL, an integer, a choice such as a status, or
    an empty JSON object (its text, ``"{}"``). Sent in the statement rather than bound: each bound parameter costs the
    client more CPU than its text costs the server."""
    if constant is None:
        return "NULL"
    if isinstance(constant, int) and not isinstance(constant, bool):
        return str(constant)
    if not isinstance(constant, str) or not re.fullmatch(r"[A-Z_]+|\{\}", constant):
        raise ValueError(f"Not a constant the statements write as a literal: {constant!r}")
    return f"'{constant}'"


@functools.cache
def update_held_sql(
    alias: str, names: tuple[str, ...], later: tuple[str, ...], event: tuple[str, ...] = ()
) -> str:
    """``UPDATE … SET names = %s, later = clock + %s WHERE scope = %s AND key = %s AND fence = %s AND
    claim_token = %s AND status = %s``: the row named by its key and the claim's token, never by
    primary key and fence; a non-empty ``event`` appends an event of those fields to the attempts
    log (parameters after the later ones)."""
    quote = connections[alias].ops.quote_name
    vendor = connections[alias].vendor
    clock = later_sql(vendor)
    log = quote(column("attempts_log"))
    assignments = ", ".join(
        [
            *(f"{quote(column(name))} = %s" for name in names),
            *(f"{quote(column(name))} = {clock}" for name in later),
            *([f"{log} = {history.append_sql(vendor, log, event)}"] if event else []),
        ]
    )
    where = " AND ".join(
        f"{quote(column(name))} = %s" for name in ("scope", "key", "fence", "claim_token", "status")
    )
    return f"UPDATE {_table(alias)} SET {assignments} WHERE {where}"


_ADAPTED = frozenset(
    found.name
    for found in IdempotencyRecord._meta.concrete_fields
    if isinstance(found, (models.JSONField, models.DateTimeField))
)


def prepare(connection: Any, name: str, value: Any) -> Any:
    """``value`` as the field prepares it for the database, as the ORM would. Text and integers go
    as they are on every backend: only JSON and datetimes are adapted (and cost a call)."""
    if value is None or name not in _ADAPTED:
        return value
    return field(name).get_db_prep_save(value, connection)


Converter = Callable[[Any, Any, Any], Any]
_converters: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], list[tuple[Any, list[Converter]]]]] = (
    weakref.WeakKeyDictionary()
)


def decode(connection: Any, names: tuple[str, ...], values: Sequence[Any]) -> list[Any]:
    """``values`` read from the columns of ``names``, converted as the ORM converts them."""
    known = _converters.setdefault(connection, {})
    if names not in known:  # the backend's and the field's converters, found once per connection
        columns = [field(name).cached_col for name in names]
        known[names] = [
            (col, [*connection.ops.get_db_converters(col), *col.field.get_db_converters(connection)])
            for col in columns
        ]
    decoded = []
    for value, (col, converters) in zip(values, known[names], strict=True):
        for convert in converters:
            value = convert(value, col, connection)
        decoded.append(value)
    return decoded
