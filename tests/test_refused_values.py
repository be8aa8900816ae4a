"""Values the database refuses (NaN, ±Infinity, NUL, lone surrogates) never re-run a body or leave a key stuck.

Runs on whichever database DATABASE_URL names: PostgreSQL, MariaDB or SQLite.
"""

from __future__ import annotations

import decimal
from typing import Any

import pytest

from django_idempotent_tasks import signals, values
from django_idempotent_tasks.exceptions import AttemptsExhausted, UnstorableResult
from django_idempotent_tasks.models import IdempotencyRecord
from tests.helpers import calls
from tests.running import run_task as run
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)
KINDS = sorted(tasks.REFUSED)


def error_of(record: IdempotencyRecord) -> dict[str, str]:
    assert record.error is not None
    return dict(record.error)


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_result_marks_the_key_done_and_replays(kind: str) -> None:
    reasons: list[str] = []

    def unstorable(sender: Any, reason: str, **kwargs: Any) -> None:
        reasons.append(reason)

    signals.result_unstorable.connect(unstorable)
    try:
        with pytest.raises(UnstorableResult, match="is done and will not run again"):
            run(tasks.refused_result, kind, key=f"r-{kind}")  # eager runs say so loudly
        assert run(tasks.refused_result, kind, key=f"r-{kind}") is None
    finally:
        signals.result_unstorable.disconnect(unstorable)
    record = IdempotencyRecord.objects.get(key=f"r-{kind}")
    assert (record.status, record.result, error_of(record)["type"]) == ("SUCCEEDED", None, "UnstorableResult")
    assert len(reasons) == 1 and reasons[0] in error_of(record)["message"]
    assert calls(f"r-{kind}") == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_step_value_fails_the_key_for_good(kind: str) -> None:
    with pytest.raises(ValueError, match="Step 'refused' cannot be checkpointed"):
        run(tasks.refused_step, kind, key=f"s-{kind}")
    with pytest.raises(AttemptsExhausted, match="Step 'refused' cannot be checkpointed"):
        run(tasks.refused_step, kind, key=f"s-{kind}")
    record = IdempotencyRecord.objects.get(key=f"s-{kind}")
    assert (record.status, record.steps) == ("FAILED", {})
    assert calls(f"s-{kind}") == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_error_message_is_stored_escaped(kind: str) -> None:
    with pytest.raises(RuntimeError, match="bad record"):
        run(tasks.refused_error, kind, key=f"e-{kind}")
    record = IdempotencyRecord.objects.get(key=f"e-{kind}")
    assert record.status == "FAILED"
    assert error_of(record)["type"] == "RuntimeError"
    assert error_of(record)["message"].startswith("bad record: ab") and error_of(record)["message"].endswith(
        "cd"
    )
    assert "bad record" in error_of(record)["traceback"]
    assert calls(f"e-{kind}") == 1


class Unprintable(decimal.Decimal):
    """A value whose encoding runs code that fails (DjangoJSONEncoder calls str() on a Decimal)."""

    def __str__(self) -> str:
        raise LookupError("no printable form")


@pytest.mark.parametrize(
    ("value", "max_depth", "why"),
    [
        ({"nested": [[[[1]]]]}, 3, "nested 5 levels deep; the database stores at most 3"),
        ({"ok": [[1]]}, 3, None),
    ],
)
def test_a_result_deeper_than_the_column_allows_is_unstorable(
    value: Any, max_depth: int, why: str | None
) -> None:
    stored, problem = values.encode_result(value, 1_000_000, max_depth=max_depth)
    assert (problem is None) == (why is None)
    assert why is None or (stored is None and problem is not None and why in problem)


def test_an_encoder_hook_that_fails_is_unstorable_not_a_crash() -> None:
    stored, problem = values.encode_result({"amount": Unprintable("1.5")}, 1_000_000)
    assert stored is None
    assert problem == "The result could not be encoded as JSON: LookupError('no printable form')"
