"""Settings of the app, read lazily so that ``override_settings`` works."""

from __future__ import annotations

import functools
from typing import Any

from celery.utils.time import get_exponential_backoff_interval
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_idempotent_tasks.exceptions import IdempotencyConfigurationError


def _positive_int(name: str, default: int) -> int:
    value = getattr(settings, name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise IdempotencyConfigurationError(f"{name} must be a positive integer, got {value!r}.")
    return value


class Settings:
    """The settings, each validated and kept once read; a changed setting (override_settings) is
    read again: reading them on every delivery cost more than its round trips."""

    @functools.cached_property
    def CACHE(self) -> str:
        """Alias of the django-redis cache that holds the locks."""
        value = getattr(settings, "IDEMPOTENT_TASKS_CACHE", "default")
        if not isinstance(value, str) or not value:
            raise IdempotencyConfigurationError(
                f"IDEMPOTENT_TASKS_CACHE must be a cache alias (a str), got {value!r}."
            )
        return value

    @functools.cached_property
    def LOCK_TTL(self) -> int:
        """Seconds a lock and lease live without renewal."""
        return _positive_int("IDEMPOTENT_TASKS_LOCK_TTL", 60)

    @functools.cached_property
    def RECORD_TTL(self) -> int:
        """Seconds a finished record is kept before it may be purged."""
        return _positive_int("IDEMPOTENT_TASKS_RECORD_TTL", 7 * 24 * 3600)

    @functools.cached_property
    def MAX_RESULT_BYTES(self) -> int:
        """Largest JSON result stored, in bytes."""
        return _positive_int("IDEMPOTENT_TASKS_MAX_RESULT_BYTES", 64 * 1024)

    @functools.cached_property
    def MAX_ATTEMPTS(self) -> int:
        """Claims before a key is failed for good."""
        return _positive_int("IDEMPOTENT_TASKS_MAX_ATTEMPTS", 5)

    @functools.cached_property
    def CONFLICT_RETRY_DELAY(self) -> int:
        """Countdown in seconds of a delivery re-queued by a conflict."""
        return _positive_int("IDEMPOTENT_TASKS_CONFLICT_RETRY_DELAY", 1)

    @functools.cached_property
    def OUTBOX(self) -> bool:
        """Default of the per-task ``outbox`` option: a PENDING record written in the caller's transaction."""
        value = getattr(settings, "IDEMPOTENT_TASKS_OUTBOX", False)
        if not isinstance(value, bool):
            raise IdempotencyConfigurationError(
                f"IDEMPOTENT_TASKS_OUTBOX must be True or False, got {value!r}."
            )
        return value

    @functools.cached_property
    def REDRIVE_AFTER(self) -> int:
        """Seconds a PENDING record waits (from its message's ETA, if any) before it is sent again."""
        return _positive_int("IDEMPOTENT_TASKS_REDRIVE_AFTER", 600)

    def validate(self) -> None:
        """Read every setting once, raising on the first invalid one."""
        for name in (
            "CACHE",
            "LOCK_TTL",
            "RECORD_TTL",
            "MAX_RESULT_BYTES",
            "MAX_ATTEMPTS",
            "CONFLICT_RETRY_DELAY",
            "OUTBOX",
            "REDRIVE_AFTER",
        ):
            getattr(self, name)


conf = Settings()


@receiver(setting_changed)
def _setting_changed(setting: str, **kwargs: Any) -> None:
    if setting.startswith("IDEMPOTENT_TASKS_"):
        vars(conf).clear()


def conflict_countdown(conflicts: int, lock_ttl: int) -> int:
    """Seconds before a delivery re-queued by a conflict runs again: exponential, full jitter, capped."""
    # Capped at lock_ttl: by then the holder has renewed its lease or lost it, so waiting longer
    # only delays the replay. Never below the configured delay, so losers never spin.
    factor = conf.CONFLICT_RETRY_DELAY
    jittered = get_exponential_backoff_interval(factor, conflicts, max(factor, lock_ttl), full_jitter=True)
    return max(factor, jittered)
