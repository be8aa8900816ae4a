"""The task the demo compares the shop's charge against: the usual, non-idempotent version."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from shop import gateway
from shop.models import Order


# Results are ignored, as usual for tasks whose effect is their result: a worker lost after the task
# returned then redelivers it (with a stored SUCCESS, Celery would ack it instead).
@shared_task(
    bind=True,
    autoretry_for=(gateway.GatewayTimeout,),
    max_retries=3,
    default_retry_delay=0,
    ignore_result=True,
)
def charge_customer(self: Any, order_id: int) -> str:
    """The usual task: every delivery charges again."""
    order = Order.objects.get(pk=order_id)
    charge_id = gateway.charge(order.pk, order.amount_cents)
    gateway.confirm(charge_id)
    return charge_id
