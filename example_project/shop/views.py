"""Checkout: one order per checkout attempt, its charge and e-mail enqueued once the order commits."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from django_idempotent_tasks.models import IdempotencyRecord
from shop.models import Order, Replay
from shop.tasks import charge_customer_idempotent, send_order_confirmation


class CheckoutForm(forms.Form):
    customer_email = forms.EmailField(initial="ada@example.com")
    amount_cents = forms.IntegerField(min_value=50, initial=1999)
    checkout_key = forms.CharField(widget=forms.HiddenInput, max_length=64)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A new key each time the form is rendered: one per checkout attempt.
        self.fields["checkout_key"].initial = uuid.uuid4().hex


def place_order(customer_email: str, amount_cents: int, checkout_key: str) -> Order:
    """The order of this checkout attempt, created and paid for only the first time."""
    with transaction.atomic():
        order, created = Order.objects.get_or_create(
            checkout_key=checkout_key,
            defaults={"customer_email": customer_email, "amount_cents": amount_cents},
        )
        if created:
            # Sent only if the order commits. The keys name one unit of work on this order, so a
            # redelivered message replays instead of charging or e-mailing again.
            charge_customer_idempotent.delay_on_commit(
                order.pk, idempotency_key=order.idempotency_key("charge")
            )
            send_order_confirmation.delay_on_commit(order.pk, idempotency_key=order.idempotency_key("email"))
    return order


def checkout(request: HttpRequest) -> HttpResponse:
    form = CheckoutForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        order = place_order(**form.cleaned_data)
        return redirect("order-detail", pk=order.pk)
    return render(request, "shop/checkout.html", {"form": form, "orders": Order.objects.order_by("-pk")[:10]})


def order_detail(request: HttpRequest, pk: int) -> HttpResponse:
    order = get_object_or_404(Order, pk=pk)
    keys = [order.idempotency_key("charge"), order.idempotency_key("email")]
    replays = dict(Replay.objects.filter(key__in=keys).values_list("key", "count"))
    records = [
        (record, replays.get(record.key, 0))
        for record in IdempotencyRecord.objects.filter(key__in=keys).order_by("key")
    ]
    return render(
        request, "shop/order.html", {"order": order, "charges": order.charges.all(), "records": records}
    )
