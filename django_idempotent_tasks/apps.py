from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IdempotentTasksConfig(AppConfig):
    name = "django_idempotent_tasks"
    verbose_name = _("Idempotent tasks")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.checks import Tags, register

        from django_idempotent_tasks import canvas, celery_checks, checks, logs

        canvas.install()
        logs.install()

        tag = checks.TAG
        register(checks.check_settings, tag)
        register(checks.check_lock_cache, tag, Tags.caches)
        register(checks.check_lock_eviction, tag, Tags.caches, deploy=True)
        register(celery_checks.check_celery_app, tag)
        register(checks.check_record_databases, tag, Tags.database)
        register(checks.check_key_collation, tag, Tags.database)
        register(celery_checks.check_purge_scheduled, tag, deploy=True)
        register(celery_checks.check_redrive_scheduled, tag, deploy=True)
        register(celery_checks.check_outbox_database, tag, deploy=True)
        register(celery_checks.check_db_reuse, tag, deploy=True)
        register(checks.check_records_table, tag, deploy=True)
        register(checks.check_replication, tag, Tags.database, deploy=True)
