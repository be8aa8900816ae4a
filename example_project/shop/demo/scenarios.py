"""The six causes of duplicate execution, each run against the plain and the idempotent task."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.models import Sum

from shop import gateway
from shop.demo import broker, hooks
from shop.demo.tasks import charge_customer
from shop.models import Charge, Delivery, Order
from shop.tasks import charge_customer_idempotent

QUEUE = "demo"
BURST = 20
UNFINISHED = ("requeued", "retried")  # outcomes after which the same message comes back
QUIET = 1.0  # seconds without a pending message or a running delivery that end a scenario
PLAIN, IDEMPOTENT = charge_customer, charge_customer_idempotent


class NotSettled(Exception):
    """The workers did not finish a scenario in time."""


@dataclass(frozen=True)
class Outcome:
    """What the database says happened to the two orders of one scenario."""

    number: int
    title: str
    deliveries_plain: int
    deliveries_idempotent: int
    charges_plain: int
    charges_idempotent: int
    replays: int
    gateway_dedups: int
    seconds: float

    @classmethod
    def count(cls, number: int, title: str, plain: Order, idempotent: Order, seconds: float) -> Outcome:
        dedups = Charge.objects.filter(order=idempotent).aggregate(total=Sum("duplicate_requests"))["total"]
        return cls(
            number=number,
            title=title,
            deliveries_plain=Delivery.objects.filter(order=plain).count(),
            deliveries_idempotent=Delivery.objects.filter(order=idempotent).count(),
            charges_plain=Charge.objects.filter(order=plain).count(),
            charges_idempotent=Charge.objects.filter(order=idempotent).count(),
            replays=Delivery.objects.filter(order=idempotent, outcome="replayed").count(),
            gateway_dedups=dedups or 0,
            seconds=seconds,
        )


class Demo:
    """Sends the demo's tasks and waits until the workers are done with them."""

    def __init__(self, recorder: broker.Recorder, timeout: float = 90) -> None:
        self.recorder = recorder
        self.timeout = timeout

    def order(self) -> Order:
        return Order.objects.create(customer_email="ada@example.com", amount_cents=1999)

    def send(self, task: Any, order: Order) -> str:
        kwargs = {"idempotency_key": order.idempotency_key("charge")} if task is IDEMPOTENT else {}
        return str(task.apply_async((order.pk,), kwargs, queue=QUEUE).id)

    def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise NotSettled(f"Timed out after {self.timeout:.0f} s waiting for {what}.")
            time.sleep(0.1)

    def settle(self, *orders: Order, at_least: int = 1) -> None:
        """Wait for ``at_least`` deliveries of each order (the ones the fault must cause), then until
        no message is queued or unacknowledged and no delivery of ``orders`` runs."""
        self.wait_for(
            lambda: all(deliveries(order) >= at_least for order in orders),
            f"{at_least} deliveries of each order",
        )
        quiet_since: float | None = None
        deadline = time.monotonic() + self.timeout
        while True:
            if self._quiet(orders):
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= QUIET:
                    return
            else:
                quiet_since = None
            if time.monotonic() > deadline:
                raise NotSettled(f"Timed out after {self.timeout:.0f} s waiting for the workers to finish.")
            time.sleep(0.1)

    def _quiet(self, orders: tuple[Order, ...]) -> bool:
        if broker.pending(QUEUE):
            return False
        latest = {}  # task id -> its last delivery: a re-queued or retried one must be followed by another
        rows = Delivery.objects.filter(order__in=orders).order_by("pk")
        for task_id, outcome, finished_at, pid in rows.values_list(
            "task_id", "outcome", "finished_at", "pid"
        ):
            latest[task_id] = (outcome, finished_at, pid)
        return not any(
            outcome in UNFINISHED or (finished_at is None and _alive(pid))
            for outcome, finished_at, pid in latest.values()
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def deliveries(order: Order) -> int:
    return Delivery.objects.filter(order=order).count()


def killed_before_ack(demo: Demo, plain: Order, idempotent: Order) -> None:
    for task, order in ((PLAIN, plain), (IDEMPOTENT, idempotent)):
        hooks.arm(hooks.KILL, order.pk)
        demo.send(task, order)
    demo.settle(plain, idempotent, at_least=2)


def visibility_timeout(demo: Demo, plain: Order, idempotent: Order) -> None:
    for task, order in ((PLAIN, plain), (IDEMPOTENT, idempotent)):
        gateway.stall(order.pk)  # the task outlives the visibility timeout, stuck confirming
        demo.send(task, order)
    stalled = [plain, idempotent]

    def release_redelivered() -> bool:
        # Each order is released once redelivered, so its copies stop piling up on the workers.
        for order in [o for o in stalled if deliveries(o) >= 2]:
            gateway.unstall(order.pk)
            stalled.remove(order)
        return not stalled

    demo.wait_for(release_redelivered, "the broker to hand the stalled messages to another worker")
    demo.settle(plain, idempotent)


def retry_after_partial_success(demo: Demo, plain: Order, idempotent: Order) -> None:
    for task, order in ((PLAIN, plain), (IDEMPOTENT, idempotent)):
        gateway.simulate_timeouts(order.pk, 2)  # the charge goes through, its confirmation times out twice
        demo.send(task, order)
    demo.settle(plain, idempotent, at_least=3)


def lost_ack(demo: Demo, plain: Order, idempotent: Order) -> None:
    # One after the other: a worker whose connection drops cancels every task it is running.
    for task, order in ((PLAIN, plain), (IDEMPOTENT, idempotent)):
        hooks.arm(hooks.CUT, order.pk)
        demo.send(task, order)
        # While the worker reconnects, the restored message may sit in memory only (neither queued
        # nor unacknowledged in Redis), so settling waits for its redelivery first.
        demo.settle(order, at_least=2)


def republished(demo: Demo, plain: Order, idempotent: Order) -> None:
    sent = [demo.send(PLAIN, plain), demo.send(IDEMPOTENT, idempotent)]
    demo.settle(plain, idempotent)
    for task_id in sent:
        demo.recorder.republish(task_id)
    demo.settle(plain, idempotent, at_least=2)


def burst(demo: Demo, plain: Order, idempotent: Order) -> None:
    for _ in range(BURST):
        demo.send(PLAIN, plain)
        demo.send(IDEMPOTENT, idempotent)
    demo.settle(plain, idempotent, at_least=BURST)


@dataclass(frozen=True)
class Scenario:
    number: int
    title: str
    run: Callable[[Demo, Order, Order], None]

    def __call__(self, demo: Demo) -> Outcome:
        started = time.monotonic()
        plain, idempotent = demo.order(), demo.order()
        self.run(demo, plain, idempotent)
        return Outcome.count(self.number, self.title, plain, idempotent, time.monotonic() - started)


SCENARIOS = [
    Scenario(1, "worker SIGKILLed after the charge, before the ack", killed_before_ack),
    Scenario(2, "visibility timeout: redelivered while running", visibility_timeout),
    Scenario(3, "retry after partial success (autoretry_for)", retry_after_partial_success),
    Scenario(4, "lost ack: broker connection cut before the ack", lost_ack),
    Scenario(5, "operator re-publishes a dead-lettered message", republished),
    Scenario(6, f"same key sent {BURST} times at once", burst),
]
