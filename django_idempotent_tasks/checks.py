"""System checks for settings that break the guarantee (``manage.py check``), in ID order; the
Celery app's are in celery_checks, and apps.py registers both."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router
from redis.exceptions import RedisError

from django_idempotent_tasks import outages
from django_idempotent_tasks.conf import conf
from django_idempotent_tasks.locks import LOCK_CACHE_HINT, lock_cache_problem

PREFIX = "django_idempotent_tasks"
TAG = "django_idempotent_tasks"


def lock_cache() -> tuple[str, dict[str, Any]] | None:
    """The alias and settings of the lock cache, if it is a valid django-redis cache."""
    try:
        alias = conf.CACHE
    except ImproperlyConfigured:
        return None
    cache: Any = settings.CACHES.get(alias, {})
    if not str(cache.get("BACKEND", "")).startswith("django_redis."):
        return None
    return alias, cache


def check_lock_cache(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E001: IDEMPOTENT_TASKS_CACHE names a django-redis cache; W005: one with a socket timeout."""
    try:
        alias = conf.CACHE
    except ImproperlyConfigured:
        return []  # reported by E002
    problem = lock_cache_problem(alias)
    if problem is not None:
        return [checks.Error(problem, hint=LOCK_CACHE_HINT, id=f"{PREFIX}.E001")]
    cache: Any = settings.CACHES[alias]
    if cache.get("OPTIONS", {}).get("SOCKET_TIMEOUT") is None:
        return [
            checks.Warning(
                f"The lock cache {alias!r} has no SOCKET_TIMEOUT: when its Redis stops answering, "
                "idempotent tasks hang on the lock instead of failing and being retried.",
                hint=f'Add "SOCKET_TIMEOUT": 5 and "SOCKET_CONNECT_TIMEOUT": 5 to CACHES[{alias!r}]["OPTIONS"].',
                id=f"{PREFIX}.W005",
            )
        ]
    return []


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E002: every IDEMPOTENT_TASKS_* setting has the right type and range."""
    try:
        conf.validate()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), hint="Fix the setting in settings.py.", id=f"{PREFIX}.E002")]
    return []


_FOLDED_PAIRS = (("a", "A"), ("e", "\u00e9"), ("a", "a "))


def check_key_collation(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E004: on MySQL/MariaDB, the scope or key column has a collation that folds distinct keys."""
    from django_idempotent_tasks.models import IdempotencyRecord

    alias = router.db_for_write(IdempotencyRecord)
    if not databases or alias not in databases or connections[alias].vendor != "mysql":
        return []
    table = IdempotencyRecord._meta.db_table
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME IN ('scope', 'key') "
            "ORDER BY COLUMN_NAME DESC",
            [table],
        )
        columns = cursor.fetchall()
        folding = [
            (column, collation)
            for column, charset, collation in columns
            if _folds(cursor, charset, collation)
        ]
    return [
        checks.Error(
            f"The {column!r} column of {table} (database {alias!r}) has the collation {collation}, which "
            "treats keys differing only in case, accents or trailing spaces as one key: one task's key "
            "would replay or refuse another's.",
            hint="Run the migrations of django_idempotent_tasks (0002 sets a binary NO PAD collation), "
            "or ALTER the column back to utf8mb4_nopad_bin (MariaDB) or utf8mb4_0900_bin (MySQL).",
            id=f"{PREFIX}.E004",
        )
        for column, collation in folding
    ]


def _folds(cursor: Any, charset: str, collation: str) -> bool:
    # Ask the server rather than read the name: utf8mb4_bin is binary yet pads trailing spaces.
    if not re.fullmatch(r"\w+", charset) or not re.fullmatch(r"\w+", collation):
        return True
    same = " OR ".join(
        f"CONVERT(%s USING {charset}) COLLATE {collation} = CONVERT(%s USING {charset})"
        for _ in _FOLDED_PAIRS
    )
    cursor.execute(f"SELECT {same}", [value for pair in _FOLDED_PAIRS for value in pair])
    return bool(cursor.fetchone()[0])


def check_lock_eviction(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W007 (deploy): the lock Redis may not evict keys; asks the live Redis."""
    found = lock_cache()
    if found is None:
        return []
    alias = found[0]
    from django_idempotent_tasks.locks import lock_client

    try:
        config = lock_client().config_get("maxmemory*")
    except RedisError as exc:
        return [
            checks.Warning(
                f"Could not read the maxmemory-policy of the lock Redis (cache {alias!r}): "
                f"{str(exc).rstrip('.') or type(exc).__name__}. "
                "This deploy check needs a live Redis.",
                hint="Run check --deploy where the lock Redis answers, and make sure its maxmemory-policy "
                "is noeviction.",
                id=f"{PREFIX}.W007",
            )
        ]
    policy = str(config.get("maxmemory-policy", "noeviction"))
    maxmemory = int(config.get("maxmemory", 0))
    if policy == "noeviction" or maxmemory == 0:
        return []
    return [
        checks.Warning(
            f"The lock Redis (cache {alias!r}) has maxmemory {maxmemory} with maxmemory-policy {policy}: "
            "once full it evicts keys, locks included, and duplicate deliveries then rely on the "
            "database lease alone. (Read from the live Redis by check --deploy.)",
            hint="Set maxmemory-policy noeviction on the lock Redis, or give the locks a Redis of their own.",
            id=f"{PREFIX}.W007",
        )
    ]


def check_record_databases(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W008: the database routers read the records from another database than they write them to."""
    from django_idempotent_tasks.models import IdempotencyRecord

    read, write = router.db_for_read(IdempotencyRecord), router.db_for_write(IdempotencyRecord)
    if read == write:
        return []
    return [
        checks.Warning(
            f"The database routers read idempotency records from {read!r} but write them to {write!r}. "
            f"Deliveries, the admin and the commands use {write!r} for both: a replica lagging behind "
            "would answer that a finished key never ran.",
            hint="Nothing to do if that is what you want; route django_idempotent_tasks to one database "
            "to silence this.",
            id=f"{PREFIX}.W008",
        )
    ]


def check_records_table(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E005 (deploy): the records' database answers and holds the records' table."""
    from django_idempotent_tasks.models import IdempotencyRecord

    alias = router.db_for_write(IdempotencyRecord)
    table = IdempotencyRecord._meta.db_table
    hint = (
        f"Check DATABASES[{alias!r}] (NAME, USER, PASSWORD, HOST) and run `manage.py migrate "
        f"--database {alias}`. Deliveries re-queue themselves until it answers, and log an ERROR."
    )
    try:
        with connections[alias].cursor() as cursor:
            tables = connections[alias].introspection.table_names(cursor)
    except DatabaseError as exc:
        message = f"The database {alias!r} of the idempotency records cannot be used: {outages.reason(exc)}."
        return [checks.Error(message, hint=hint, id=f"{PREFIX}.E005")]
    if table not in tables:
        message = f"The database {alias!r} of the idempotency records has no table {table}."
        return [checks.Error(message, hint=hint, id=f"{PREFIX}.E005")]
    return []


def check_replication(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W011 (deploy, ``--database``): the records' database streams to standbys without waiting for any."""
    from django_idempotent_tasks.models import IdempotencyRecord

    alias = router.db_for_write(IdempotencyRecord)
    if not databases or alias not in databases:
        return []  # a database check: Django runs it only when asked (check --database)
    connection = connections[alias]
    try:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT sync_state FROM pg_stat_replication")
                states = [row[0] for row in cursor.fetchall()]
                cursor.execute(
                    "SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit')"
                )
                names, commit = cursor.fetchone()
                problem = postgresql_replication_problem(states, names, commit)
            elif connection.vendor == "mysql":
                problem = _mysql_replication_problem(cursor)
            else:
                return []
    except DatabaseError as exc:  # no server to ask, or no right to read its replication state
        problem = f"its replication state could not be read ({str(exc).strip() or type(exc).__name__})"
    if problem is None:
        return []
    return [
        checks.Warning(
            f"The database {alias!r} that holds the idempotency records {problem}. A failover to a "
            "standby that had not received the last commits loses claims and completions: finished "
            "bodies run again, and two holders can each believe they hold a key. (Read from the live "
            "database by check --deploy.)",
            hint="Use synchronous replication (synchronous_standby_names with synchronous_commit on or "
            "remote_apply; MariaDB semi-synchronous replication) and a failover manager that promotes "
            "only a synchronous standby. See docs/guarantee.md.",
            id=f"{PREFIX}.W011",
        )
    ]


def postgresql_replication_problem(
    states: Sequence[str | None], standby_names: str, synchronous_commit: str
) -> str | None:
    """What a PostgreSQL primary streaming to standbys in ``states`` (pg_stat_replication.sync_state)
    can lose on a failover, or None."""
    if not states:
        return None  # no standby: a failover has nothing to promote
    if synchronous_commit in {"off", "local"}:
        return f"streams to {len(states)} standby(s) but commits with synchronous_commit={synchronous_commit}, without waiting for any"
    waited = [state for state in states if state in {"sync", "quorum"}]
    if waited:
        return None
    if all(state is None for state in states) and standby_names.strip():
        return None  # sync_state hidden (no pg_monitor role); standbys are named as synchronous
    return (
        f"streams to {len(states)} standby(s), none of them synchronous "
        f"(sync_state {', '.join(sorted({str(state) for state in states}))}; "
        f"synchronous_standby_names is {standby_names.strip() or 'empty'!r})"
    )


def _mysql_replication_problem(cursor: Any) -> str | None:
    cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%%'")
    replicas = int(cursor.fetchone()[0])
    cursor.execute("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_status'")
    found = cursor.fetchone()
    return mysql_replication_problem(replicas, None if found is None else str(found[1]))


def mysql_replication_problem(replicas: int, semi_sync_status: str | None) -> str | None:
    """What a MySQL/MariaDB primary with ``replicas`` binlog readers can lose on a failover, or None."""
    if replicas == 0 or (semi_sync_status or "").upper() == "ON":
        return None
    return f"streams its binary log to {replicas} replica(s) without semi-synchronous replication"


# Three pairs that an exact comparison tells apart and a folding collation does not.
