"""A new front end in a few lines: a Django view honouring the ``Idempotency-Key`` header, written
against ``spec`` and ``delivery`` alone (the shape DESIGN.md promises an adapter)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import RequestFactory
from django.utils import timezone

from django_idempotent_tasks import spec
from django_idempotent_tasks.delivery import deliver
from django_idempotent_tasks.exceptions import IdempotencyError, IdempotencyKeyMismatch
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.outcomes import Busy, Completed, Replayed
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def create_order(sku: str, quantity: int = 1) -> dict[str, Any]:
    """The business function behind the view: its arguments are the request's JSON body."""
    effect = Effect.objects.create(key=sku, task="create_order", pid=0)
    return {"order": effect.pk, "sku": sku, "quantity": quantity}


ORDERS = spec.for_function(
    create_order,
    key=None,
    scope="api.orders",
    lock_ttl=None,
    record_ttl=None,
    atomic=False,
    max_attempts=None,
    on_conflict="raise",
)


def orders_view(request: HttpRequest) -> HttpResponse:
    """POST /orders: one order per ``Idempotency-Key``; a retry answers what the first call did."""
    payload = json.loads(request.body)
    try:
        call = ORDERS.prepare((), {**payload, "idempotency_key": request.headers.get("Idempotency-Key")})
        outcome = deliver(ORDERS.delivery(call), lambda idempotency: create_order(**payload))
    except IdempotencyKeyMismatch as exc:
        return JsonResponse({"error": str(exc)}, status=422)
    except (IdempotencyError, TypeError) as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    if isinstance(outcome, Busy):
        return JsonResponse({"error": outcome.message}, status=409)
    assert isinstance(outcome, (Replayed, Completed))
    response = JsonResponse(outcome.value, status=201 if isinstance(outcome, Completed) else 200)
    response["Idempotent-Replayed"] = "true" if isinstance(outcome, Replayed) else "false"
    return response


def post(body: dict[str, Any], key: str | None) -> HttpResponse:
    headers = {} if key is None else {"Idempotency-Key": key}
    request = RequestFactory().post(
        "/orders", json.dumps(body), content_type="application/json", headers=headers
    )
    return orders_view(request)


def test_a_retried_request_replays_the_first_response() -> None:
    first = post({"sku": "tea"}, "req-1")
    again = post({"sku": "tea", "quantity": 1}, "req-1")  # the default passed explicitly: the same call
    assert (first.status_code, again.status_code) == (201, 200)
    assert (first["Idempotent-Replayed"], again["Idempotent-Replayed"]) == ("false", "true")
    assert json.loads(first.content) == json.loads(again.content)
    assert Effect.objects.count() == 1
    assert IdempotencyRecord.objects.get().scope == "api.orders"


def test_the_adapter_maps_misuse_and_conflicts_to_status_codes() -> None:
    assert post({"sku": "tea"}, None).status_code == 400
    assert post({"sku": "tea"}, "bad\nkey").status_code == 400
    assert post({"sku": "tea", "colour": "red"}, "req-2").status_code == 400
    assert post({"sku": "tea"}, "req-2").status_code == 201
    assert post({"sku": "coffee"}, "req-2").status_code == 422
    IdempotencyRecord.objects.filter(key="req-2").update(
        status="IN_PROGRESS", lease_expires_at=timezone.now() + timedelta(minutes=5)
    )
    assert post({"sku": "tea"}, "req-2").status_code == 409
    assert Effect.objects.count() == 1
