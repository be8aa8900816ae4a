"""Settings of the app, read lazily so that ``override_settings`` works."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
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

    def validate(self) -> None:
        """Read every setting once, raising on the first invalid one."""
        for name in (
            "CACHE",
            "LOCK_TTL",
            "RECORD_TTL",
            "MAX_RESULT_BYTES",
            "MAX_ATTEMPTS",
            "CONFLICT_RETRY_DELAY",
        ):
            getattr(self, name)


conf = Settings()


@receiver(setting_changed)
def _setting_changed(setting: str, **kwargs: Any) -> None:
    if setting.startswith("IDEMPOTENT_TASKS_"):
        vars(conf).clear()


ON_CONFLICT_CHOICES = ("retry", "wait", "raise")
ASYNC_BODY = (
    "Idempotent task {name!r} is an async def. Celery calls a task's body as a plain function and "
    "runs coroutines only under an asyncio worker pool, so the coroutine would never be awaited and "
    "the key would be marked done with None. Write the task as a def that runs the coroutine: "
    "return asyncio.run(work(...))."
)


def conflict_countdown(conflicts: int, lock_ttl: int) -> int:
    """Seconds before a delivery re-queued by a conflict runs again: exponential, full jitter, capped."""
    # Capped at lock_ttl: by then the holder has renewed its lease or lost it, so waiting longer
    # only delays the replay. Never below the configured delay, so losers never spin.
    factor = conf.CONFLICT_RETRY_DELAY
    jittered = get_exponential_backoff_interval(factor, conflicts, max(factor, lock_ttl), full_jitter=True)
    return max(factor, jittered)


@dataclass(frozen=True)
class TaskOptions:
    """A task's own options, checked once when it is bound; ``None`` means "the setting"."""

    task_name: str
    scope: str
    key_source: str | Callable[..., Any] | None
    lock_ttl: int | None
    record_ttl: int | None
    on_conflict: str
    atomic: bool
    max_attempts: int | None

    # Settings are read at use, not at bind: tasks are bound before override_settings applies, and
    # reading a setting is one attribute lookup.
    @property
    def effective_lock_ttl(self) -> int:
        """``lock_ttl``, else IDEMPOTENT_TASKS_LOCK_TTL."""
        return conf.LOCK_TTL if self.lock_ttl is None else self.lock_ttl

    @property
    def effective_record_ttl(self) -> int:
        """``record_ttl``, else IDEMPOTENT_TASKS_RECORD_TTL."""
        return conf.RECORD_TTL if self.record_ttl is None else self.record_ttl

    @property
    def effective_max_attempts(self) -> int:
        """``max_attempts``, else IDEMPOTENT_TASKS_MAX_ATTEMPTS."""
        return conf.MAX_ATTEMPTS if self.max_attempts is None else self.max_attempts


def _option_error(task_name: str, option: str, value: Any, rule: str) -> IdempotencyConfigurationError:
    return IdempotencyConfigurationError(
        f"Idempotent task {task_name!r}: {option}={value!r} is invalid; {rule}."
    )


def _seconds_option(task_name: str, option: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        rule = "it must be a positive whole number of seconds, or None for the setting"
        raise _option_error(task_name, option, value, rule)
    return value


def task_options(task: Any) -> TaskOptions:
    """Validate the options of an idempotent task (class or instance) and freeze them."""
    name = task.name
    source = task.idempotency_key
    if source is not None and not callable(source) and not (isinstance(source, str) and source):
        raise _option_error(name, "idempotency_key", source, "it must be a template str or a callable")
    scope = task.idempotency_scope
    if scope is not None and not (isinstance(scope, str) and scope.strip()):
        raise _option_error(name, "idempotency_scope", scope, "it must be a non-empty str, or None")
    if task.on_conflict not in ON_CONFLICT_CHOICES:
        rule = f"it must be one of {', '.join(map(repr, ON_CONFLICT_CHOICES))}"
        raise _option_error(name, "on_conflict", task.on_conflict, rule)
    if not isinstance(task.atomic, bool):
        raise _option_error(name, "atomic", task.atomic, "it must be True or False")
    max_attempts = task.max_attempts
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts <= 0
    ):
        raise _option_error(name, "max_attempts", max_attempts, "it must be a positive int, or None")
    return TaskOptions(
        task_name=name,
        scope=scope or name,
        key_source=source,
        lock_ttl=_seconds_option(name, "lock_ttl", task.lock_ttl),
        record_ttl=_seconds_option(name, "record_ttl", task.record_ttl),
        on_conflict=task.on_conflict,
        atomic=task.atomic,
        max_attempts=max_attempts,
    )
