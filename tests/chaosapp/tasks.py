"""The chaos tasks: each body makes one external call (a ledger entry) and one database effect."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import shared_task
from celery.signals import after_task_publish, task_postrun, task_received

from django_idempotent_tasks.tasks import IdempotentTask
from tests import db_sessions
from tests.chaos.plan import is_outbox
from tests.chaosapp import control
from tests.chaosapp.models import ChaosEffect

# Leases of 6 s renewed every 2 s: a Redis call stuck for its 2 s socket timeout cannot starve
# the renewal, and a crashed holder's key is taken over within seconds.
LEASE = 6
# The queue the faults send to, so a duplicate meant to arrive mid-fault skips the backlog.
URGENT = "chaos.urgent"


def run_body(task: Any, value: Any, sleep: float = 0, database: bool = True) -> dict[str, Any]:
    idem = task.idempotency
    control.body_started()
    control.reached("after_claim", idem.key)
    control.external_call(idem.key, idem.fence, task.request.id or "")
    control.reached("after_external", idem.key)
    if database:  # a non-atomic body's effect is its external call only
        ChaosEffect.objects.create(
            key=idem.key, task=task.name, pid=os.getpid(), fence=idem.fence, recovered=idem.recovered
        )
    control.reached("after_effect", idem.key)
    time.sleep(sleep)
    return {"key": idem.key, "value": value, "fence": idem.fence, "pid": os.getpid()}


@shared_task(base=IdempotentTask, bind=True, name="chaos.effect", atomic=True, lock_ttl=LEASE)
def chaos_effect(self: Any, value: int) -> dict[str, Any]:
    return run_body(self, value)


@shared_task(base=IdempotentTask, bind=True, name="chaos.external", lock_ttl=LEASE)
def chaos_external(self: Any, value: int) -> dict[str, Any]:
    """Half of the mix: a non-atomic body whose effect is outside the database."""
    return run_body(self, value, database=False)


@shared_task(base=IdempotentTask, bind=True, name="chaos.outbox", atomic=True, lock_ttl=LEASE, outbox=True)
def chaos_outbox(self: Any, value: int) -> dict[str, Any]:
    """chaos.effect through the outbox: its record is written PENDING by the sender."""
    return run_body(self, value)


@shared_task(base=IdempotentTask, bind=True, name="chaos.outbox_external", lock_ttl=LEASE, outbox=True)
def chaos_outbox_external(self: Any, value: int) -> dict[str, Any]:
    """chaos.external through the outbox."""
    return run_body(self, value, database=False)


def task_for(key: str) -> Any:
    """Odd keys run non-atomic (external effect only), even keys atomic (plus a database effect)."""
    return chaos_external if int(key.rsplit("-", 1)[1]) % 2 else chaos_effect


def chaos_task_for(key: str) -> Any:
    """The chaos suite's mix: ``task_for``, and a fifth of the keys (tests.chaos.plan.is_outbox)
    through the outbox, atomic or not as ``task_for`` says."""
    if not is_outbox(key):
        return task_for(key)
    return chaos_outbox if task_for(key) is chaos_effect else chaos_outbox_external


@shared_task(base=IdempotentTask, bind=True, name="chaos.cut", lock_ttl=LEASE)
def chaos_cut(self: Any, value: int) -> dict[str, Any]:
    """P7: the server cuts this body's idle connection while it sleeps; the completion reconnects."""
    db_sessions.cut_when_idle()
    return run_body(self, value, sleep=3, database=False)


@shared_task(base=IdempotentTask, bind=True, name="chaos.refused", lock_ttl=LEASE)
def chaos_refused(self: Any, value: int) -> Any:
    """V1: a result no database stores; the key is still done, and replays stay identical."""
    run_body(self, value, database=False)
    return {"ratio": float("nan"), "value": value}


@shared_task(base=IdempotentTask, bind=True, name="chaos.slow", atomic=True, lock_ttl=2)
def chaos_slow(self: Any, value: int, sleep: float) -> dict[str, Any]:
    """W7: a body longer than its lock TTL; renewal must keep the key."""
    control.control().set(f"held:{self.idempotency.key}", str(os.getpid()))
    return run_body(self, value, sleep)


@shared_task(base=IdempotentTask, bind=True, name="chaos.poison", atomic=True, lock_ttl=2, max_attempts=2)
def chaos_poison(self: Any, value: int) -> None:
    """W9: crashes its process every time it runs."""
    run_body(self, value)
    control.died(os.getpid())
    os._exit(1)


@task_postrun.connect
def kill_after_completion(sender: Any = None, kwargs: Any = None, **extra: Any) -> None:
    """W2: die after the record is SUCCEEDED, before the ack."""
    if isinstance(kwargs, dict) and "idempotency_key" in kwargs:
        control.reached("postrun", kwargs["idempotency_key"])


@task_received.connect
def note_received(request: Any = None, **extra: Any) -> None:
    """Received ids tell a message the broker never delivered apart from one we lost."""
    if request is not None:
        control.received(request.id)


@after_task_publish.connect
def note_published(headers: Any = None, **extra: Any) -> None:
    """Copies handed to the broker, counted against copies received: a re-queued copy that never
    reached a worker was lost by the broker (a main process SIGKILLed as it took the message)."""
    if isinstance(headers, dict) and headers.get("id"):
        control.published(headers["id"])
