"""The shop's idempotent tasks: the charge of an order and its confirmation e-mail."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.core.mail import send_mail

from django_idempotent_tasks.tasks import IdempotentTask
from shop import gateway
from shop.models import Order


@shared_task(
    base=IdempotentTask,
    bind=True,
    autoretry_for=(gateway.GatewayTimeout,),
    max_retries=3,
    default_retry_delay=0,
    ignore_result=True,
)
def charge_customer_idempotent(self: Any, order_id: int) -> str:
    """Charge an order once per key, whatever the deliveries."""
    order = Order.objects.get(pk=order_id)
    # A retry after a timed-out confirmation finds the charge checkpointed and skips it. The
    # subkey lets the gateway absorb the one case a checkpoint cannot: a crash inside the step.
    charge_id = self.idempotency.step(
        "charge",
        lambda: gateway.charge(order.pk, order.amount_cents, self.idempotency.subkey("charge")),
    )
    gateway.confirm(charge_id)  # confirming a confirmed charge changes nothing: no step needed
    return str(charge_id)


@shared_task(base=IdempotentTask, bind=True)
def send_order_confirmation(self: Any, order_id: int) -> int:
    """E-mail the customer once per key (the console backend prints it)."""
    order = Order.objects.get(pk=order_id)
    return send_mail(
        subject=f"Your order {order.pk}",
        message=f"Thank you! We charged {order.amount_cents / 100:.2f} EUR.",
        from_email="shop@example.com",
        recipient_list=[order.customer_email],
    )
