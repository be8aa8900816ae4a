"""``manage.py release_idempotency_lock``: free a key whose worker died holding its lock or lease."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from django_idempotent_tasks import store
from django_idempotent_tasks.locks import worker_identity
from django_idempotent_tasks.management import key_state, options
from django_idempotent_tasks.models import IdempotencyRecord


class Command(BaseCommand):
    help = "Release the stuck Redis lock and expired lease of an idempotency key so that it can run again."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("key", type=options.non_empty, help="The idempotency key to release. Required.")
        parser.add_argument(
            "--scope",
            type=options.non_empty,
            help="The scope of the key (the task name unless the task sets idempotency_scope). "
            "Default: the only scope holding the key.",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="Release a live lease too, for a worker known to be gone; the delivery still running, "
            "if any, can no longer complete. Default: off.",
        )

    def handle(self, *, key: str, scope: str | None, force: bool, verbosity: int, **extra: Any) -> None:
        record = key_state.find_record(key, scope)
        if record is not None:
            scope = record.scope
        elif scope is None:
            raise CommandError(
                f"No record with key {key!r} in any scope. Pass --scope to release its Redis lock."
            )
        name = key_state.label(scope, key)
        if record is not None and record.lease_is_live and not force:
            raise CommandError(
                f"The lease of {name} is live until {key_state.when(record.lease_expires_at)} (held by "
                f"{record.worker}, fence {record.fence}): refusing to release it. Wait for it to expire, "
                "or pass --force if that worker is gone. Nothing was changed."
            )
        # Each line is written as soon as its step is done, so a Redis failure after the lease
        # was released still reports the release.
        self._say(verbosity, self._release_lease(name, record, force))
        self._say(verbosity, self._release_lock(scope, key, name))

    def _say(self, verbosity: int, line: str) -> None:
        if verbosity >= 1:
            self.stdout.write(line)

    def _release_lease(self, name: str, record: IdempotencyRecord | None, force: bool) -> str:
        if record is None:
            return f"No record for {name}: no lease to release."
        if record.status != IdempotencyRecord.Status.IN_PROGRESS:
            return f"The record of {name} is {record.status}: no lease to release."
        kind = "live" if record.lease_is_live else "expired"
        if not store.release_lease(
            record, by=f"release_idempotency_lock on {worker_identity()}", force=force
        ):
            raise CommandError(
                f"The record of {name} changed while its lease was being released (another delivery "
                "moved it on): nothing was released. Run the command again."
            )
        return (
            f"Released the {kind} lease of {name} (fence {record.fence}, worker {record.worker or '-'}): "
            "the record is FAILED now and the next delivery runs the task again."
        )

    def _release_lock(self, scope: str, key: str, name: str) -> str:
        state = key_state.lock_state(scope, key)
        if state.error is not None:
            raise CommandError(f"Could not read the Redis lock of {name}: {state.error}.")
        if state.token is None:
            return f"The Redis lock of {name} was not held."
        try:
            released = key_state.release_lock(scope, key, state.token)
        except RedisError as exc:
            raise CommandError(
                f"Could not release the Redis lock of {name}: {str(exc).rstrip('.')}."
            ) from exc
        if not released:
            return f"The Redis lock of {name} changed hands while being released: left as it is."
        return f"Released the Redis lock of {name}, held by {state.describe_holder()}."
