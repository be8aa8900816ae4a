"""The explorer's four task kinds; their DB effects are ChaosEffect rows, their external calls a list."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import shared_task

from django_idempotent_tasks.tasks import IdempotentTask
from tests.chaosapp.models import ChaosEffect
from tests.explorer import probe
from tests.testapp.faults import control

# A 2 s lease, renewed every 2/3 s: a crashed holder's key is taken over within seconds.
LEASE = 2
# The external kind's body outlives one renewal interval, so renew and extend are boundaries too.
RENEWING_BODY = 0.9
MAX_ATTEMPTS = 3


class Flaky(Exception):
    """The failing kind's first attempt."""


def external_call(task: Any) -> None:
    """The body's call outside the database: an entry that no rollback takes back."""
    idem = task.idempotency
    with probe.around("external", "call"):
        control().rpush(f"explore:ext:{idem.key}", f"{os.getpid()} {idem.fence} {int(idem.recovered)}")


def effect(task: Any, name: str) -> int:
    idem = task.idempotency
    ChaosEffect.objects.create(
        key=idem.key, task=name, pid=os.getpid(), fence=idem.fence, recovered=idem.recovered
    )
    return int(idem.fence)


def answer(task: Any, value: int) -> dict[str, Any]:
    return {"key": task.idempotency.key, "value": value, "fence": task.idempotency.fence}


@shared_task(base=IdempotentTask, bind=True, name="explore.external", lock_ttl=LEASE)
def explore_external(self: Any, value: int) -> dict[str, Any]:
    """Non-atomic, with one external call."""
    external_call(self)
    time.sleep(RENEWING_BODY)
    return answer(self, value)


@shared_task(base=IdempotentTask, bind=True, name="explore.atomic", lock_ttl=LEASE, atomic=True)
def explore_atomic(self: Any, value: int) -> dict[str, Any]:
    """atomic=True with one database write."""
    effect(self, "explore.atomic")
    return answer(self, value)


@shared_task(base=IdempotentTask, bind=True, name="explore.steps", lock_ttl=LEASE)
def explore_steps(self: Any, value: int) -> dict[str, Any]:
    """Two checkpointed steps, each with a database write committed with its checkpoint."""
    self.idempotency.step("a", lambda: effect(self, "explore.steps:a"))
    self.idempotency.step("b", lambda: effect(self, "explore.steps:b"))
    return answer(self, value)


@shared_task(
    base=IdempotentTask,
    bind=True,
    name="explore.flaky",
    lock_ttl=LEASE,
    atomic=True,
    max_attempts=MAX_ATTEMPTS,
    autoretry_for=(Flaky,),
    max_retries=MAX_ATTEMPTS,
    default_retry_delay=0,
)
def explore_flaky(self: Any, value: int) -> dict[str, Any]:
    """atomic=True, fails its first attempt, then succeeds (autoretry_for)."""
    effect(self, "explore.flaky")
    if self.idempotency.attempt == 1:
        raise Flaky("the first attempt fails")
    return answer(self, value)


KINDS = {
    "external": explore_external,
    "atomic": explore_atomic,
    "steps": explore_steps,
    "flaky": explore_flaky,
}
# The ChaosEffect rows each kind commits exactly once when its key succeeds.
EFFECTS = {
    "external": [],
    "atomic": ["explore.atomic"],
    "steps": ["explore.steps:a", "explore.steps:b"],
    "flaky": ["explore.flaky"],
}
