from __future__ import annotations

from typing import Any

from django.db import models
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
        """FAILED records and stuck ones: a new delivery may take them over."""
        return self.filter(status=IdempotencyRecord.Status.FAILED) | self.stuck()

    def expired(self) -> IdempotencyRecordQuerySet:
        """Records past their retention that no live lease protects."""
        return self.filter(expires_at__lt=DatabaseNow()).not_live()


class IdempotencyRecord(models.Model):
    """One idempotency key: who holds it, how it ended and what it returned."""

    class Status(models.TextChoices):
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
        indexes = [models.Index(fields=["expires_at"], name="django_idempotent_expires_idx")]
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
