from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from django_idempotent_tasks import keys
from django_idempotent_tasks.exceptions import InvalidIdempotencyKey, MissingIdempotencyKey


@pytest.mark.parametrize("key", ["a", "order-charge-42", "x" * 255, "ключ-ü", "a*b?[c]:d"])
def test_valid_keys_pass_unchanged(key: str) -> None:
    assert keys.validate_key(key) == key


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "must not be empty or only whitespace"),
        ("   \t", "must not be empty or only whitespace"),
        (42, "must be a str, got int"),
        (b"bytes", "must be a str, got bytes"),
        ({"a": 1}, "must be a str, got dict"),
        (None, "must be a str, got NoneType"),
        ("x" * 256, "at most 255 characters, got 256"),
        ("a\x00b", "must not contain control characters"),
        ("line\nbreak", "must not contain control characters"),
    ],
)
def test_invalid_keys_name_the_rule(key: Any, message: str) -> None:
    with pytest.raises(InvalidIdempotencyKey, match=message):
        keys.validate_key(key)


def test_invalid_key_is_a_value_error() -> None:
    assert issubclass(InvalidIdempotencyKey, ValueError)
    assert issubclass(MissingIdempotencyKey, ValueError)


def run(order_id: int, amount: int = 5, **extra: Any) -> None:
    """A stand-in for a task body."""


def test_template_renders_over_bound_arguments_with_defaults() -> None:
    assert keys.derive_key("order-{order_id}-{amount}", "t", run, (42,), {}) == "order-42-5"
    assert keys.derive_key("o-{order_id}-{note}", "t", run, (), {"order_id": 1, "note": "n"}) == "o-1-n"


def test_template_naming_an_unknown_argument_says_how_to_fix_it() -> None:
    with pytest.raises(MissingIdempotencyKey, match=r"could not derive.*\{customer\}.*idempotency_key="):
        keys.derive_key("{customer}", "shop.charge", run, (1,), {})


def test_callable_source_gets_the_call_arguments_and_is_validated() -> None:
    assert keys.derive_key(lambda order_id, **kw: f"c-{order_id}", "t", run, (3,), {}) == "c-3"
    with pytest.raises(InvalidIdempotencyKey):
        keys.derive_key(lambda order_id: "", "t", run, (3,), {})


def test_fingerprint_is_stable_ignores_the_key_and_sees_arguments() -> None:
    base = keys.fingerprint([1, Decimal("2.50")], {"b": 1, "a": 2})
    assert base == keys.fingerprint([1, Decimal("2.50")], {"a": 2, "b": 1, "idempotency_key": "k"})
    assert base != keys.fingerprint([1, Decimal("2.51")], {"a": 2, "b": 1})
    assert len(base) == 64


def test_subkey_is_stable_and_distinct_per_name_scope_and_key() -> None:
    first = keys.subkey("scope", "key", "charge")
    assert first == keys.subkey("scope", "key", "charge")
    others = {
        keys.subkey("scope", "key", "refund"),
        keys.subkey("other", "key", "charge"),
        keys.subkey("scope", "key2", "charge"),
    }
    assert first not in others and len(others) == 3


def test_lock_names_are_hashed_so_user_text_never_forms_a_pattern() -> None:
    name = keys.lock_name("scope", "a*b?[c]")
    assert name.startswith("django_idempotent_tasks:lock:")
    assert not set("*?[]") & set(name)
    # A separator inside the key cannot make two scopes collide.
    assert keys.lock_name("a:b", "c") != keys.lock_name("a", "b:c")


def test_loggable_shortens_long_keys() -> None:
    assert keys.loggable("short") == "short"
    long = keys.loggable("customer-jane.doe@example.com-order-991")
    assert "jane.doe@example.com" not in long and long.startswith("customer-jane.do")


@pytest.mark.parametrize("name", ["", " ", "a\nb", "x" * 101, 5])
def test_invalid_step_names_are_refused(name: Any) -> None:
    with pytest.raises(ValueError, match="step name"):
        keys.validate_step_name(name)


class Unequal:
    """An argument whose ``==`` raises, as some array and proxy types do."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("the truth value is ambiguous")

    __hash__ = object.__hash__


def test_passed_arguments_spread_var_keyword_and_keep_what_cannot_be_compared() -> None:
    default = Unequal()

    def run(order_id: int, flag: Unequal = default, **options: Any) -> None: ...

    given = Unequal()
    assert keys.passed_arguments(run, (7,), {"flag": given, "currency": "EUR"}) == {
        "order_id": 7,
        "flag": given,
        "currency": "EUR",
    }
    assert keys.passed_arguments(run, (7,), {}) == {"order_id": 7}
