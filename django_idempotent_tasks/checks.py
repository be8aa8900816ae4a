"""System checks for settings that break the guarantee (``manage.py check``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_idempotent_tasks.conf import conf

PREFIX = "django_idempotent_tasks"


def register() -> None:
    checks.register(check_settings)
    checks.register(check_lock_cache)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E002: every IDEMPOTENT_TASKS_* setting has the right type and range."""
    try:
        conf.validate()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), hint="Fix the setting in settings.py.", id=f"{PREFIX}.E002")]
    return []


def check_lock_cache(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E001: IDEMPOTENT_TASKS_CACHE names a django-redis cache."""
    try:
        alias = conf.CACHE
    except ImproperlyConfigured:
        return []  # reported by E002
    cache: Any = settings.CACHES.get(alias, {})
    backend = str(cache.get("BACKEND", ""))
    if not backend.startswith("django_redis."):
        return [
            checks.Error(
                f"IDEMPOTENT_TASKS_CACHE is {alias!r}, which is not a django-redis cache (backend {backend!r}).",
                hint='Add a cache with "BACKEND": "django_redis.cache.RedisCache" and name it in IDEMPOTENT_TASKS_CACHE.',
                id=f"{PREFIX}.E001",
            )
        ]
    return []
