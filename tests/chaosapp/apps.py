from __future__ import annotations

from django.apps import AppConfig


class ChaosAppConfig(AppConfig):
    name = "tests.chaosapp"
    label = "chaosapp"
    default_auto_field = "django.db.models.BigAutoField"
