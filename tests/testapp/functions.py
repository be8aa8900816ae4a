"""Sample ``@idempotent`` functions and ``django.tasks`` tasks; each body run writes an ``Effect`` row."""

from __future__ import annotations

import os
import time
from typing import Any

from django_idempotent_tasks.decorators import idempotent
from django_idempotent_tasks.idempotency import current
from tests.testapp.faults import control, reached
from tests.testapp.models import Effect

try:
    from django.tasks import task as task  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import task as task  # type: ignore[no-redef, unused-ignore]


def effect(name: str, value: Any) -> dict[str, Any]:
    idem = current()
    control().incr(f"calls:{idem.key}")  # an external call: it survives a rollback
    Effect.objects.create(
        key=idem.key, task=name, pid=os.getpid(), fence=idem.fence, recovered=idem.recovered
    )
    reached("after_effect", idem.key)
    return {"value": value, "fence": idem.fence, "recovered": idem.recovered}


@idempotent
def record(value: Any, sleep: float = 0) -> dict[str, Any]:
    result = effect("record", value)
    time.sleep(sleep)
    return result


@idempotent(key="order-charge-{order_id}", lock_ttl=60)
def charge(order_id: int, amount_cents: int) -> dict[str, Any]:
    return effect("charge", amount_cents)


@idempotent(key=lambda order_id, **_: f"callable-{order_id}")
def charge_callable(order_id: int) -> dict[str, Any]:
    return effect("charge_callable", order_id)


@idempotent
def takes_key(value: Any, idempotency_key: str) -> str:
    return f"{value}:{idempotency_key}"


@idempotent(lock_ttl=2)
def short_lease(value: Any, sleep: float = 0) -> dict[str, Any]:
    result = effect("short_lease", value)
    time.sleep(sleep)
    return result


@idempotent(lock_ttl=2, atomic=True)
def short_lease_atomic(value: Any, sleep: float = 0) -> dict[str, Any]:
    result = effect("short_lease_atomic", value)
    time.sleep(sleep)
    return result


@idempotent(lock_ttl=2)
def outlives_its_lease(sleep: float) -> bool:
    """A body longer than its lease (renewed every 2/3 s); returns whether it was told it lost it."""
    time.sleep(sleep)
    return bool(current().lease_lost)


@idempotent(atomic=True)
def atomic_record(value: Any, fail: bool = False) -> dict[str, Any]:
    result = effect("atomic_record", value)
    if fail:
        raise RuntimeError("the body failed after its write")
    return result


@idempotent(on_conflict="raise")
def raising_conflict(value: Any) -> dict[str, Any]:
    return effect("raising_conflict", value)


@idempotent(max_attempts=2)
def failing(value: Any) -> dict[str, Any]:
    effect("failing", value)
    raise ValueError(f"failure {current().attempt}")


@idempotent
def unstorable(value: Any) -> Any:
    effect("unstorable", value)
    return object()


@idempotent
def stepped(amount: int, fail_after_charge: bool = False) -> dict[str, Any]:
    idem = current()
    charged = idem.step("charge", lambda: effect("stepped", amount))
    with idem.step("ship") as ship:
        if not ship.done:
            if fail_after_charge and idem.attempt == 1:
                raise RuntimeError("shipping failed")
            ship.result = {"shipped": amount}
    return {"charged": charged["value"], "ship": ship.result, "attempt": idem.attempt}


# django.tasks. With @idempotent outermost, .enqueue() validates the key before anything is stored.


@idempotent(key="receipt-{order_id}")
@task()
def send_receipt(order_id: int) -> dict[str, Any]:
    return effect("send_receipt", order_id)


@task()
@idempotent()
def send_receipt_inner(order_id: int) -> dict[str, Any]:
    return effect("send_receipt_inner", order_id)


@idempotent(lock_ttl=2)
@task(backend="database")
def db_receipt(order_id: int, sleep: float = 0) -> dict[str, Any]:
    result = effect("db_receipt", order_id)
    time.sleep(sleep)
    return result


def context_task(context: Any, order_id: int) -> int:
    """A task body that takes django.tasks' context, which @idempotent refuses."""
    return order_id
