"""What every supported database stores: results and step values checked, error texts made storable."""

from __future__ import annotations

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
    return error_shape(type(exc).__name__, str(exc), tb)


def storable_text(text: str) -> str:
    """``text`` with what some database refuses (NUL, lone surrogates) written as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


# A JSON string escape of NUL (not preceded by an escaped backslash): PostgreSQL's jsonb refuses it.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def encode_result(value: Any, max_bytes: int) -> tuple[Any, str | None]:
    """The JSON form stored for ``value``, or (None, why it cannot be stored on every database)."""
    try:
        text = json.dumps(
            value, cls=DjangoJSONEncoder, sort_keys=True, separators=(",", ":"), allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        return None, f"The result is not JSON serializable: {exc}"
    except RecursionError:
        return None, "The result is nested too deeply for the JSON encoder (RecursionError)."
    except Exception as exc:  # an encoder hook (a __str__, a default()) that failed: still unstorable
        return None, f"The result could not be encoded as JSON: {exc!r}"
    if _JSON_NUL.search(text):
        return None, "The result contains a NUL character (\\u0000), which PostgreSQL's jsonb refuses."
    if len(text.encode()) > max_bytes:
        return None, (
            f"The result is {len(text.encode())} bytes of JSON, over "
            f"IDEMPOTENT_TASKS_MAX_RESULT_BYTES ({max_bytes})."
        )
    try:
        stored = json.loads(text)
    except RecursionError:
        return None, "The result is nested too deeply for the JSON decoder (RecursionError)."
    try:
        json.dumps(stored, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return None, "The result contains a lone surrogate, which is not UTF-8 and which databases refuse."
    return stored, None
