"""Checkout: create the order and enqueue its charge and e-mail once the order is committed."""

from __future__ import annotations

from django import forms
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from shop.models import Order
from shop.tasks import charge_customer_idempotent, send_order_confirmation


class CheckoutForm(forms.Form):
    customer_email = forms.EmailField(initial="ada@example.com")
    amount_cents = forms.IntegerField(min_value=50, initial=1999)


def checkout(request: HttpRequest) -> HttpResponse:
    form = CheckoutForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            order = Order.objects.create(**form.cleaned_data)
            # Sent only if the order commits; each key names one unit of work on this order,
            # so a double-clicked button or a redelivered message never charges twice.
            charge_customer_idempotent.delay_on_commit(
                order.pk, idempotency_key=order.idempotency_key("charge")
            )
            send_order_confirmation.delay_on_commit(order.pk, idempotency_key=order.idempotency_key("email"))
        return redirect("order-detail", pk=order.pk)
    return render(request, "shop/checkout.html", {"form": form, "orders": Order.objects.order_by("-pk")[:10]})


def order_detail(request: HttpRequest, pk: int) -> HttpResponse:
    order = get_object_or_404(Order, pk=pk)
    return render(request, "shop/order.html", {"order": order, "charges": order.charges.all()})
