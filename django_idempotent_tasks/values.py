"""What every supported database stores: results and step values checked, error texts made storable."""

from __future__ import annotations

import decimal
import json
import re
import traceback
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder


class UnstorableValue(ValueError):
    """A step's value that the database cannot store; the key fails for good rather than re-run it."""


def error_shape(type_name: str, message: str, tb: str = "") -> dict[str, str]:
    """The one shape of a stored error: type, message and traceback, made storable on every database."""
    return {
        "type": storable_text(type_name),
        "message": storable_text(message),
        "traceback": storable_text(tb),
    }


def describe_error(exc: BaseException) -> dict[str, str]:
    """The JSON stored for a failure: type, message and traceback."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return error_shape(type(exc).__name__, error_message(exc), tb)


def error_message(exc: BaseException) -> str:
    """``str(exc)``, or what the error is when its ``__str__`` fails (a client's ``return self.detail``)."""
    # The body's error must reach the record and the caller: an error raised rendering it would
    # replace it and leave the key IN_PROGRESS.
    try:
        return str(exc)
    except Exception:
        pass
    name = type(exc).__name__
    try:
        return f"{name} (its str() failed): {exc!r}"
    except Exception:
        return f"{name} (its str() and repr() failed)"


def error_repr(exc: BaseException) -> str:
    """``repr(exc)``, or the error's type when its ``__repr__`` fails."""
    try:
        return repr(exc)
    except Exception:
        return f"{type(exc).__name__} (its repr() failed)"


def storable_text(text: str) -> str:
    """``text`` with what some database refuses (NUL, lone surrogates) written as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


# A JSON string escape of NUL (not preceded by an escaped backslash): PostgreSQL's jsonb refuses it.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _may_hold_surrogates(text: str) -> bool:
    """The ASCII JSON ``text`` escapes a surrogate (a pair, or a lone one that no database stores):
    the only way its decoded value can hold one. Without such an escape, no second encoding is needed."""
    return "\\ud" in text or "\\uD" in text


# A JSON string literal, and anything but a bracket: what json_depth() skips.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str) -> int:
    """How many levels the JSON ``text`` nests its arrays and objects."""
    depth = deepest = 0
    for char in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if char in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


# One encoder for every result (stateless, as keys.py's): json.dumps(cls=…) built a new one per call.
_RESULT_JSON = DjangoJSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
_UNICODE_JSON = json.JSONEncoder(ensure_ascii=False)


def jsonb_number(text: str) -> float | int:
    """A JSON float as PostgreSQL's jsonb gives it back: a numeric, written without an exponent
    (``1e+16`` is the integer 10000000000000000) and without a negative zero."""
    if "e+" in text or "E+" in text:  # Python writes a float from 1e16 up so, always integral
        return int(decimal.Decimal(text))
    number = float(text)
    return 0.0 if number == 0 else number


def encode_result(
    value: Any, max_bytes: int, max_depth: int | None = None, what: str = "The result", jsonb: bool = False
) -> tuple[Any, str | None]:
    """The JSON form stored for ``value``, or (None, why it cannot be stored on every database).

    ``max_depth``: the deepest nesting the column accepts (MariaDB refuses 32 levels or more);
    ``what``: how the reasons name the value; ``jsonb``: the form is what PostgreSQL's jsonb reads
    back (its numbers), so that a first execution returns what its replays will.
    """
    if value is None:  # most bodies return nothing: stored as NULL, nothing to encode or check
        return None, None
    try:
        text = _RESULT_JSON.encode(value)
    except (TypeError, ValueError) as exc:
        return None, f"{what} is not JSON serializable: {error_message(exc)}"
    except RecursionError:
        return None, f"{what} is nested too deeply for the JSON encoder (RecursionError)."
    except Exception as exc:  # an encoder hook (a __str__, a default()) that failed: still unstorable
        return None, f"{what} could not be encoded as JSON: {error_repr(exc)}"
    if "\\u0000" in text and _JSON_NUL.search(text):
        return None, f"{what} contains a NUL character (\\u0000), which PostgreSQL's jsonb refuses."
    if len(text.encode()) > max_bytes:
        return None, (
            f"{what} is {len(text.encode())} bytes of JSON, over "
            f"IDEMPOTENT_TASKS_MAX_RESULT_BYTES ({max_bytes})."
        )
    # Counting brackets first keeps the scan off every ordinary result.
    if max_depth is not None and text.count("[") + text.count("{") > max_depth:
        depth = json_depth(text)
        if depth > max_depth:
            return None, f"{what} is nested {depth} levels deep; the database stores at most {max_depth}."
    try:
        stored = json.loads(text, parse_float=jsonb_number if jsonb else None)
    except RecursionError:
        return None, f"{what} is nested too deeply for the JSON decoder (RecursionError)."
    if not _may_hold_surrogates(text):
        return stored, None
    try:
        _UNICODE_JSON.encode(stored).encode("utf-8")
    except UnicodeEncodeError:
        return None, f"{what} contains a lone surrogate, which is not UTF-8 and which databases refuse."
    return stored, None
