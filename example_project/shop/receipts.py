"""The order's receipt as a django.tasks task: idempotent without Celery (see the README)."""

from __future__ import annotations

from django.core.mail import send_mail

from django_idempotent_tasks.decorators import idempotent
from shop.models import Order

try:
    from django.tasks import task
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import task


@idempotent(key="order-{order_id}-receipt")
@task()
def send_receipt(order_id: int) -> str:
    """E-mail the receipt once per order, however often it is enqueued."""
    order = Order.objects.get(pk=order_id)
    send_mail(
        f"Receipt for order {order.pk}",
        f"We charged {order.amount_cents} cents.",
        None,
        [order.customer_email],
    )
    return order.customer_email
