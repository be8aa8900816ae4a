"""Worker-side instrumentation of the demo: a ledger row per delivery, and faults armed per order.

Connected only in workers started with ``SHOP_DEMO_HOOKS=1`` (the demo's own workers).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import redis
from celery.signals import task_postrun, task_prerun, worker_process_shutdown
from django.conf import settings
from django.utils import timezone
from django_redis import get_redis_connection

from django_idempotent_tasks.signals import task_replayed
from shop.models import Delivery

DEMO_TASKS = ("shop.demo.tasks.charge_customer", "shop.tasks.charge_customer_idempotent")
KILL, CUT = "kill", "cut"
_open: dict[str, tuple[int, int | None]] = {}  # task id -> (Delivery pk, order id), in this process
_replayed: set[str] = set()


def connect() -> None:
    task_prerun.connect(record_delivery, weak=False)
    task_replayed.connect(mark_replay, weak=False)
    task_postrun.connect(finish_delivery, weak=False)
    worker_process_shutdown.connect(save_coverage, weak=False)


def save_coverage(**_: Any) -> None:
    # Pool children leave with os._exit, which skips coverage's atexit hook; under the test suite
    # (COVERAGE_PROCESS_START) save what this child measured of the app.
    try:
        import coverage
    except ImportError:
        return
    measuring = coverage.Coverage.current()
    if measuring is not None:
        measuring.stop()
        measuring.save()


def arm(fault: str, order_id: int) -> None:
    """Make the first delivery for ``order_id`` that finishes trigger ``fault`` before its ack."""
    get_redis_connection("default").set(f"demo:fault:{order_id}", fault, ex=300)


def record_delivery(
    sender: Any = None, task_id: str = "", args: Any = (), kwargs: Any = None, **_: Any
) -> None:
    if sender is None or sender.name not in DEMO_TASKS:
        return
    order_id = (kwargs or {}).get("order_id", args[0] if args else None)
    info = sender.request.delivery_info or {}
    delivery = Delivery.objects.create(
        task_id=task_id,
        task_name=sender.name,
        order_id=order_id,
        pid=os.getpid(),
        redelivered=bool(info.get("redelivered")),
    )
    _open[task_id] = (delivery.pk, order_id)


def mark_replay(sender: Any = None, **_: Any) -> None:
    if sender is not None and sender.request.id:
        _replayed.add(sender.request.id)


def finish_delivery(sender: Any = None, task_id: str = "", state: str | None = None, **_: Any) -> None:
    pk, order_id = _open.pop(task_id, (None, None))
    if pk is None:
        return
    outcome = "replayed" if task_id in _replayed else OUTCOMES.get(state or "", (state or "").lower())
    _replayed.discard(task_id)
    Delivery.objects.filter(pk=pk).update(outcome=outcome, finished_at=timezone.now())
    fault = get_redis_connection("default").getdel(f"demo:fault:{order_id}")
    if fault == KILL.encode():
        # The task finished (and an idempotent one stored its result); the ack has not been sent.
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == CUT.encode():
        cut_parent_broker_connections()


OUTCOMES = {"SUCCESS": "ran", "RETRY": "retried", "IGNORED": "requeued", "FAILURE": "failed"}


def cut_parent_broker_connections() -> int:
    """Close the worker main process's broker connections before it can send the ack."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    name = f"example_project-{os.getppid()}"
    killed = 0
    for entry in client.client_list():
        if entry.get("name") == name:
            killed += client.client_kill_filter(_id=entry["id"])
    client.close()
    return killed
