from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IdempotentTasksConfig(AppConfig):
    name = "django_idempotent_tasks"
    verbose_name = _("Idempotent tasks")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_idempotent_tasks import checks

        checks.register()
