from __future__ import annotations

from typing import Any

from django.db import connections, models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_idempotent_tasks.fields import ExactCharField


def now_sql(vendor: str) -> str:
    """SQL of the database server's clock as a UTC timestamp (``%`` escaped for a parameterised query)."""
    if vendor == "postgresql":
        return "CLOCK_TIMESTAMP()"  # not now(): that is the start of the transaction
    if vendor == "mysql":
        return "UTC_TIMESTAMP(6)"
    return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


def later_sql(vendor: str) -> str:
    """SQL of the database clock plus ``%s`` seconds (one integer parameter)."""
    if vendor == "postgresql":
        return "CLOCK_TIMESTAMP() + %s * INTERVAL '1 second'"
    if vendor == "mysql":
        return "UTC_TIMESTAMP(6) + INTERVAL %s SECOND"
    return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || %s || ' seconds')"


class DatabaseNow(models.Func):
    """The database server's clock: every lease is written and judged by it, never a worker's."""

    output_field = models.DateTimeField()

    def __init__(self, seconds: int = 0) -> None:
        super().__init__()
        self.seconds = seconds

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        if self.seconds:
            return later_sql(connection.vendor), [int(self.seconds)]
        return now_sql(connection.vendor), []


class IdempotencyRecordQuerySet(models.QuerySet["IdempotencyRecord"]):
    def live(self) -> IdempotencyRecordQuerySet:
        """IN_PROGRESS records whose holder's lease is still running (on the database clock)."""
        return self.filter(status=IdempotencyRecord.Status.IN_PROGRESS, lease_expires_at__gte=DatabaseNow())

    def not_live(self) -> IdempotencyRecordQuerySet:
        """Records that no live lease protects: what a purge or a forced release may touch."""
        return self.exclude(status=IdempotencyRecord.Status.IN_PROGRESS, lease_expires_at__gte=DatabaseNow())

    def stuck(self) -> IdempotencyRecordQuerySet:
        """IN_PROGRESS records whose lease has expired (or is missing): the holder died or stalled."""
        return self.filter(status=IdempotencyRecord.Status.IN_PROGRESS).not_live()

    def claimable(self) -> IdempotencyRecordQuerySet:
        """FAILED, PENDING and stuck records: a new delivery may take them over."""
        waiting = [IdempotencyRecord.Status.FAILED, IdempotencyRecord.Status.PENDING]
        return self.filter(status__in=waiting) | self.stuck()

    def pending(self) -> IdempotencyRecordQuerySet:
        """PENDING records (outbox tasks): decided by a caller, not claimed by a worker yet."""
        return self.filter(status=IdempotencyRecord.Status.PENDING)

    def expired(self) -> IdempotencyRecordQuerySet:
        """Records past their retention that no live lease protects (never a PENDING one)."""
        return (
            self.filter(expires_at__lt=DatabaseNow())
            .not_live()
            .exclude(status=IdempotencyRecord.Status.PENDING)
        )

    def scopes(self, limit: int) -> list[str]:
        """The first ``limit`` scopes in use (of the whole table), read through the (scope, key) index."""
        connection = connections[self.db]
        table = connection.ops.quote_name(self.model._meta.db_table)
        sql = _DISTINCT_SCOPES.get(connection.vendor, _DISTINCT_SCOPES["sqlite"])
        with connection.cursor() as cursor:
            cursor.execute(sql.format(table=table), [limit])
            return [str(row[0]) for row in cursor.fetchall()]

    def with_key(self, key: str, scopes: list[str] | None = None) -> IdempotencyRecordQuerySet:
        """Records of ``key`` in any scope, found through the (scope, key) index one scope at a time."""
        if scopes is None:
            scopes = self.scopes(SCOPE_LIMIT)
        # key = %s alone cannot use the index, whose first column is scope: name every scope instead.
        if len(scopes) >= SCOPE_LIMIT:
            return self.filter(key=key)
        return self.filter(scope__in=scopes, key=key)


#: Past this many scopes, a key is looked up without naming them.
SCOPE_LIMIT = 1000

# A "loose index scan" of the (scope, key) unique index, one distinct scope at a time: SELECT
# DISTINCT would read every row of a large table to list a dozen task names. PostgreSQL and
# SQLite walk it with a recursive query (MIN() rather than ORDER BY … LIMIT 1 in parentheses, which
# SQLite's grammar refuses). MariaDB does not answer the recursive step from the index (it reads
# the whole index at each step), but its GROUP BY on the first column of an index skips from one
# value to the next by itself ("Using index for group-by").
_DISTINCT_SCOPES = {
    "mysql": "SELECT scope FROM {table} GROUP BY scope ORDER BY scope LIMIT %s",
    "sqlite": """
WITH RECURSIVE scopes(scope) AS (
    SELECT MIN(scope) FROM {table}
    UNION ALL
    SELECT (SELECT MIN(scope) FROM {table} WHERE scope > scopes.scope)
    FROM scopes WHERE scopes.scope IS NOT NULL
)
SELECT scope FROM scopes WHERE scope IS NOT NULL LIMIT %s
""",
}


class PostgresPartialIndex(models.Index):
    """An index of the rows matching ``where`` on PostgreSQL, of every row on the other databases.

    MySQL has no partial index (Django would skip the index there), and SQLite uses one only for a
    WHERE that repeats its condition's very terms, never for ``status = 'FAILED'``.
    """

    def __init__(self, *args: Any, where: models.Q, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.where = where

    def deconstruct(self) -> Any:
        path, args, kwargs = super().deconstruct()
        return path, args, {**kwargs, "where": self.where}

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.vendor == "postgresql":
            self.condition = self.where  # kept off otherwise, so checks on MySQL do not warn (W037)
            try:
                return super().create_sql(model, schema_editor, using=using, **kwargs)
            finally:
                self.condition = None
        return super().create_sql(model, schema_editor, using=using, **kwargs)


class IdempotencyRecord(models.Model):
    """One idempotency key: who holds it, how it ended and what it returned."""

    class Status(models.TextChoices):
        PENDING = "PENDING", _("Pending")  # outbox tasks: decided by the caller, not claimed yet
        IN_PROGRESS = "IN_PROGRESS", _("In progress")
        SUCCEEDED = "SUCCEEDED", _("Succeeded")
        FAILED = "FAILED", _("Failed")

    scope = ExactCharField(
        _("scope"), max_length=255, help_text=_("Namespace of the key; the task name by default.")
    )
    key = ExactCharField(_("key"), max_length=255, help_text=_("The idempotency key the caller chose."))
    task_name = models.CharField(_("task name"), max_length=255)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.IN_PROGRESS)
    fingerprint = models.CharField(
        _("fingerprint"), max_length=64, help_text=_("sha256 of the task's arguments.")
    )
    result = models.JSONField(_("result"), null=True, blank=True)
    error = models.JSONField(
        _("error"), null=True, blank=True, help_text=_("Type, message and traceback of the last failure.")
    )
    steps = models.JSONField(
        _("steps"), default=dict, blank=True, help_text=_("Results of the checkpointed steps, by name.")
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=1)
    attempts_log = models.JSONField(
        _("attempts log"),
        default=list,
        blank=True,
        help_text=_("The last claims of the key: holder, task id, times and how each ended."),
    )
    fence = models.PositiveIntegerField(
        _("fence"),
        default=1,
        help_text=_("Bumped on every claim; only the holder of the current fence may write."),
    )
    claim_token = models.CharField(
        _("claim token"),
        max_length=32,
        blank=True,
        default="",
        help_text=_("Random, new on every claim: the holder's writes name it, so no failover can repeat it."),
    )
    task_id = models.CharField(_("task id"), max_length=255, blank=True)
    message = models.JSONField(
        _("message"),
        null=True,
        blank=True,
        help_text=_("Outbox tasks only, while PENDING or FAILED: the message that publishes the call again."),
    )
    worker = models.CharField(
        _("worker"), max_length=255, blank=True, help_text=_("Hostname and pid of the lease holder.")
    )
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    completed_at = models.DateTimeField(_("completed at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)

    objects = IdempotencyRecordQuerySet.as_manager()

    class Meta:
        verbose_name = _("idempotency record")
        verbose_name_plural = _("idempotency records")
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="django_idempotent_tasks_scope_key_uniq")
        ]
        indexes = [
            # The purge's walk and the status command's expired count. With the id: PostgreSQL's
            # index does not hold it, and the purge seeks to (expires_at, id) between batches.
            models.Index(fields=["expires_at", "id"], name="django_idempotent_expiry_idx"),
            # The admin's status and stuck filters and the status command: the few records that
            # are not SUCCEEDED, newest first.
            PostgresPartialIndex(
                fields=["status", "id"],
                name="django_idempotent_status_idx",
                where=models.Q(status__in=["FAILED", "IN_PROGRESS"]),
            ),
            # The admin's date drill-down.
            models.Index(fields=["created_at"], name="django_idempotent_created_idx"),
            # The re-drive (PENDING, oldest first) and the admin's PENDING filter on PostgreSQL. On
            # MariaDB and SQLite, where it holds every row, idempotency_status counts by task and
            # status from it instead of reading the whole table.
            PostgresPartialIndex(
                fields=["status", "task_name", "created_at"],
                name="django_idempotent_pending_idx",
                where=models.Q(status="PENDING"),
            ),
        ]
        permissions = [("release_lease", _("Can release stuck leases"))]

    def __str__(self) -> str:
        return f"{self.scope}:{self.key}"

    @property
    def lease_is_live(self) -> bool:
        """IN_PROGRESS with a lease that has not expired, by this process's clock: for display only.

        Who may run is decided in SQL on the database clock (``live()``, ``stuck()``, ``claimable()``).
        """
        return (
            self.status == self.Status.IN_PROGRESS
            and self.lease_expires_at is not None
            and self.lease_expires_at >= timezone.now()
        )

    @property
    def is_stuck(self) -> bool:
        """IN_PROGRESS with an expired lease."""
        return self.status == self.Status.IN_PROGRESS and not self.lease_is_live
