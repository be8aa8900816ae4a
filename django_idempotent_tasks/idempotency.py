"""``self.idempotency``: what a running task knows of its key, and its checkpointed steps."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar
from types import TracebackType
from typing import Any, TypeVar

from django.db import DataError, IntegrityError, transaction

from django_idempotent_tasks import keys, store, values
from django_idempotent_tasks.exceptions import LeaseLost
from django_idempotent_tasks.values import UnstorableValue

T = TypeVar("T")
_UNSET: Any = object()


class Idempotency:
    """The key, lease and checkpoints of the delivery that is running the body."""

    def __init__(
        self,
        key: str,
        scope: str,
        claim: store.Claim,
        max_result_bytes: int,
        lost: threading.Event | None = None,
    ) -> None:
        self.key = key
        self.scope = scope
        self.claim = claim
        self.max_result_bytes = max_result_bytes
        self._lost = lost or threading.Event()
        self.steps: dict[str, Any] = dict(claim.record.steps or {})

    @property
    def fence(self) -> int:
        return self.claim.fence

    @property
    def attempt(self) -> int:
        return self.claim.attempt

    @property
    def recovered(self) -> bool:
        """An earlier attempt died mid-body: external calls it made may have happened."""
        return self.claim.recovered

    @property
    def lease_lost(self) -> bool:
        """The heartbeat found another delivery holding the key: this one must stop."""
        return self._lost.is_set()

    def ensure_lease(self, what: str) -> None:
        """Raise LeaseLost if the lease is known lost, before ``what`` runs anything."""
        if self._lost.is_set():
            raise LeaseLost(f"{what} was not run: another delivery took over the key.")

    def verify_lease(self, what: str) -> None:
        """Renew the lease on the database (a fenced write) before ``what`` runs; LeaseLost if it is gone.

        The heartbeat's flag alone is not enough: a holder paused past its lease and taken over runs
        on before its heartbeat, resumed at the same moment, has heard of it (issue #25, hole 1).
        """
        if self.claim.lease_seconds and not store.renew(self.claim, self.claim.lease_seconds):
            self._lost.set()
            raise LeaseLost(f"{what} was not run: another delivery took over the key.")

    def subkey(self, name: str) -> str:
        """A stable key for a downstream call, the same on every attempt under this key."""
        return keys.subkey(self.scope, self.key, keys.validate_step_name(name))

    def step(self, name: str, fn: Callable[[], T] | None = None) -> Any:
        """Run ``fn`` once per key and return its stored result; without ``fn``, a context manager."""
        name = keys.validate_step_name(name)
        self.ensure_lease(f"Step {name!r}")
        if name not in self.steps and store.in_transaction():
            # A rollback of that transaction would erase the checkpoint while the step's effect stays,
            # and the retry would repeat it: refuse before running anything.
            raise RuntimeError(
                f"Step {name!r} cannot run inside an open database transaction (atomic=True, "
                "transaction.atomic() in the body, autocommit turned off, or a caller's transaction "
                "around an eager call): "
                "its checkpoint would roll back with it. Run steps in a non-atomic task, outside "
                "transaction.atomic()."
            )
        if name not in self.steps:
            self.verify_lease(f"Step {name!r}")
        step = Step(self, name)
        if fn is None:
            return step
        with step:
            if not step.done:
                step.result = fn()
        return step.result

    def save_step(self, name: str, value: Any) -> Any:
        """Checkpoint one step's result with a fenced write; returns the stored JSON form."""
        self.ensure_lease(f"The checkpoint of step {name!r}")
        # The steps column holds {name: value}: the value nests one level below the column's limit.
        depth = store.json_depth_limit(inside=1)
        stored, problem = values.encode_result(
            value, self.max_result_bytes, depth, jsonb=store.stores_jsonb()
        )
        if problem is not None:
            raise UnstorableValue(f"Step {name!r} cannot be checkpointed. {problem}")
        steps = {**self.steps, name: stored}
        try:
            checkpointed = store.checkpoint(self.claim, steps)
        except (DataError, IntegrityError) as exc:  # refused for a reason not foreseen: never re-run it
            raise UnstorableValue(
                f"Step {name!r} cannot be checkpointed. The database refused it: {exc!r}"
            ) from exc
        if not checkpointed:
            self._lost.set()
            raise LeaseLost(f"Step {name!r} was not checkpointed: another delivery took over the key.")
        self.steps = steps
        return stored


class Step:
    """A checkpointed step as a context manager; its block and checkpoint commit together."""

    def __init__(self, idempotency: Idempotency, name: str) -> None:
        self.idempotency = idempotency
        self.name = name
        self.done = name in idempotency.steps
        self.result: Any = idempotency.steps.get(name, _UNSET)
        self._atomic = transaction.atomic(using=store.database())

    def __enter__(self) -> Step:
        if not self.done:
            self._atomic.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.done:
            return
        try:
            if exc is None:
                if self.result is _UNSET:
                    raise ValueError(f"Step {self.name!r} finished without setting step.result.")
                self.result = self.idempotency.save_step(self.name, self.result)
        except BaseException as error:
            self._atomic.__exit__(type(error), error, error.__traceback__)
            raise
        self._atomic.__exit__(exc_type, exc, tb)
        self.done = exc is None


# The running body's Idempotency: set by delivery.run_claimed around the body, read by current().
running: ContextVar[Idempotency | None] = ContextVar("django_idempotent_tasks_running", default=None)


def current() -> Idempotency:
    """The ``Idempotency`` of the idempotent body running now (in this thread or task)."""
    idempotency = running.get()
    if idempotency is None:
        raise RuntimeError(
            "django_idempotent_tasks.idempotency.current() is only available inside the body of an "
            "idempotent task or @idempotent function, while it runs."
        )
    return idempotency
