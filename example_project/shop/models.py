"""An order, the fake payment gateway's ledger of charges, and the demo's ledger of deliveries."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    # One per checkout attempt, made when the form is rendered: a double submit, a browser retry or
    # a reloaded POST sends the same one and finds this order instead of creating another.
    checkout_key = models.CharField(max_length=64, unique=True, null=True, blank=True)
    customer_email = models.EmailField()
    amount_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Order {self.pk}"

    def idempotency_key(self, purpose: str) -> str:
        """The key of one unit of work on this order, e.g. ``order-42-charge``."""
        return f"order-{self.pk}-{purpose}"


class Charge(models.Model):
    """One charge made by the fake gateway: money taken from the customer."""

    charge_id = models.CharField(max_length=40, unique=True)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="charges")
    amount_cents = models.PositiveIntegerField()
    idempotency_key = models.CharField(max_length=255, null=True, blank=True, unique=True)
    duplicate_requests = models.PositiveIntegerField(
        default=0, help_text="Later requests the gateway answered from this charge (same idempotency key)."
    )
    confirmed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.charge_id


class Delivery(models.Model):
    """One delivery of a task message to a worker, recorded by the demo's worker hooks."""

    task_id = models.CharField(max_length=255)
    task_name = models.CharField(max_length=255)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="deliveries", null=True)
    pid = models.PositiveIntegerField()
    redelivered = models.BooleanField(default=False)
    outcome = models.CharField(max_length=20, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "deliveries"

    def __str__(self) -> str:
        return f"{self.task_name}[{self.task_id}] {self.outcome or 'running'}"


class Replay(models.Model):
    """How many deliveries of a key were answered from its stored result (shop/receivers.py)."""

    scope = models.CharField(max_length=255)
    key = models.CharField(max_length=255)
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "key"], name="shop_replay_scope_key")]

    def __str__(self) -> str:
        return f"{self.key}: {self.count} replays"
