"""store.lookup is one raw SELECT: it must return the same record the ORM would, binding keys as data."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_idempotent_tasks import store
from django_idempotent_tasks.models import IdempotencyRecord

pytestmark = pytest.mark.django_db

AWKWARD_KEYS = ["plain", "it's %s 100%", 'quote " and \\ backslash', "*?[]:", "é ∑ 🙂"]


def _insert(scope: str, key: str) -> store.Claim:
    claim = store.insert(
        scope,
        key,
        task_name="t",
        fingerprint="f" * 64,
        task_id="id",
        worker="w",
        lease_seconds=60,
        record_ttl=60,
    )
    assert claim is not None
    return claim


def test_lookup_returns_the_record_with_decoded_fields() -> None:
    claim = _insert("scope", "k")
    assert store.complete(claim, {"nested": [1, "two", None]}, None, 60)
    record = store.lookup("scope", "k")
    assert record is not None
    assert record.pk == claim.record.pk
    assert record.status == IdempotencyRecord.Status.SUCCEEDED
    assert record.result == {"nested": [1, "two", None]}
    assert record.steps == {}
    assert (record.error, record.attempts, record.fence, record.task_id) == (None, 1, 1, "id")
    # Timestamps are the model's (the admin's); the delivery path decides by none of them.
    assert not hasattr(record, "completed_at")
    stored = IdempotencyRecord.objects.get(pk=record.pk)
    assert isinstance(stored.created_at, datetime) and stored.created_at == stored.started_at
    assert stored.completed_at is not None and stored.completed_at.tzinfo is not None


@pytest.mark.parametrize("key", AWKWARD_KEYS)
def test_lookup_binds_the_key_as_data(key: str) -> None:
    for other in AWKWARD_KEYS:
        _insert("scope", other)
    _insert("other-scope", key)
    record = store.lookup("scope", key)
    assert record is not None
    assert (record.scope, record.key) == ("scope", key)


def test_lookup_of_a_missing_key_is_none_in_one_query() -> None:
    _insert("scope", "present")
    with CaptureQueriesContext(connection) as queries:
        assert store.lookup("scope", "absent") is None
        assert store.lookup("absent-scope", "present") is None
    assert len(queries) == 2
