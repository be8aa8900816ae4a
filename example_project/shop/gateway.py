"""A fake payment gateway: every charge is a row, and like Stripe it deduplicates by idempotency key.

It can also misbehave on request, as real gateways do: ``simulate_timeouts`` makes the next
confirmations of an order time out, ``stall`` makes them hang until ``unstall``.
"""

from __future__ import annotations

import time
import uuid

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from django_redis import get_redis_connection

from shop.models import Charge

STALL_LIMIT = 60.0


class GatewayTimeout(Exception):
    """The gateway did not answer in time; the request may or may not have been applied."""


def charge(order_id: int, amount_cents: int, idempotency_key: str | None = None) -> str:
    """Take the money; a repeated ``idempotency_key`` returns the first charge instead."""
    if idempotency_key is not None:
        existing = _deduplicate(idempotency_key)
        if existing is not None:
            return existing
    try:
        with transaction.atomic():
            made = Charge.objects.create(
                charge_id=f"ch_{uuid.uuid4().hex[:24]}",
                order_id=order_id,
                amount_cents=amount_cents,
                idempotency_key=idempotency_key,
            )
    except IntegrityError:
        # A concurrent request with the same key won the race: answer with its charge.
        existing = _deduplicate(idempotency_key or "")
        if existing is None:
            raise
        return existing
    return made.charge_id


def _deduplicate(idempotency_key: str) -> str | None:
    found = Charge.objects.filter(idempotency_key=idempotency_key).values_list("pk", "charge_id").first()
    if found is None:
        return None
    Charge.objects.filter(pk=found[0]).update(duplicate_requests=F("duplicate_requests") + 1)
    return found[1]


def confirm(charge_id: str) -> str:
    """Confirm a charge (may time out or hang when the demo asked for it)."""
    order_id = Charge.objects.values_list("order_id", flat=True).get(charge_id=charge_id)
    client = get_redis_connection("default")
    deadline = time.monotonic() + STALL_LIMIT
    while client.exists(f"gateway:stall:{order_id}") and time.monotonic() < deadline:
        time.sleep(0.1)
    if client.get(f"gateway:timeouts:{order_id}") and client.decr(f"gateway:timeouts:{order_id}") >= 0:
        raise GatewayTimeout(f"confirming {charge_id} timed out")
    Charge.objects.filter(charge_id=charge_id, confirmed_at__isnull=True).update(confirmed_at=timezone.now())
    return charge_id


def simulate_timeouts(order_id: int, times: int) -> None:
    """Make the next ``times`` confirmations of the order's charges time out."""
    get_redis_connection("default").set(f"gateway:timeouts:{order_id}", times, ex=300)


def stall(order_id: int) -> None:
    """Make confirmations of the order's charges hang until ``unstall`` (at most a minute)."""
    get_redis_connection("default").set(f"gateway:stall:{order_id}", 1, ex=int(STALL_LIMIT))


def unstall(order_id: int) -> None:
    get_redis_connection("default").delete(f"gateway:stall:{order_id}")
