from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class IdempotencyError(Exception):
    """Base class of this app's errors. Do not raise directly."""


class MissingIdempotencyKey(IdempotencyError, ValueError):
    """A delivery of an idempotent task has no key."""


class InvalidIdempotencyKey(IdempotencyError, ValueError):
    """The idempotency key breaks a rule (type, length, characters)."""


class IdempotencyKeyMismatch(IdempotencyError):
    """The key was used before with different arguments."""


class TaskInProgress(IdempotencyError):
    """Another delivery holds the key right now."""


class LeaseLost(IdempotencyError):
    """This delivery's lease was taken over; its completion was refused."""


class AttemptsExhausted(IdempotencyError):
    """The key used up its attempts and is failed for good."""


class UnstorableResult(IdempotencyError):
    """An eager run finished and its key is done, but its result could not be stored (JSON, size)."""


class OutboxError(IdempotencyError, ValueError):
    """A call's arguments cannot be stored in its outbox record, or a record cannot be sent or run
    again (it holds no message, or it is in another status)."""


class IdempotencyConfigurationError(IdempotencyError, ImproperlyConfigured):
    """A setting of this app or an option of an idempotent task is missing or invalid."""
