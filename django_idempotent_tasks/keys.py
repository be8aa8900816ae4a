"""Pure functions on idempotency keys: validation, derivation, fingerprints and names."""

from __future__ import annotations

import datetime
import functools
import hashlib
import inspect
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_idempotent_tasks.exceptions import InvalidIdempotencyKey, MissingIdempotencyKey
from django_idempotent_tasks.values import error_repr

MAX_KEY_LENGTH = 255
# Unicode's categories Cc (control) and Cs (surrogate) are exactly these ranges (a regex scans a key
# in C; unicodedata.category per character cost more than a replay's round trip for long keys).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
KeySource = str | Callable[..., Any]


def validate_key(key: object) -> str:
    """Return ``key`` if it is a usable idempotency key, else raise ``InvalidIdempotencyKey``."""
    if not isinstance(key, str):
        raise InvalidIdempotencyKey(f"An idempotency key must be a str, got {type(key).__name__}.")
    if not key.strip():
        raise InvalidIdempotencyKey("An idempotency key must not be empty or only whitespace.")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidIdempotencyKey(
            f"An idempotency key must be at most {MAX_KEY_LENGTH} characters, got {len(key)}."
        )
    if _CONTROL.search(key):
        raise InvalidIdempotencyKey(
            "An idempotency key must not contain control characters (such as NUL or newline)."
        )
    if _SURROGATE.search(key):
        raise InvalidIdempotencyKey(
            "An idempotency key must be valid Unicode text: it contains a lone surrogate, which "
            "cannot be encoded as UTF-8 (decode bytes with errors='strict', not 'surrogateescape')."
        )
    return key


@functools.lru_cache(maxsize=512)
def _cached_signature(run: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(run)


def signature(run: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature(run)``, computed once per callable (a task's body is the same every call)."""
    try:
        return _cached_signature(run)
    except TypeError:
        return inspect.signature(run)  # an unhashable callable; or no signature: raises the same


@functools.lru_cache(maxsize=512)
def _plain(run: Callable[..., Any]) -> tuple[str, ...] | None:
    parameters = inspect.signature(run).parameters.values()
    if all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in parameters):
        return tuple(p.name for p in parameters)
    return None


def _plain_names(run: Callable[..., Any]) -> tuple[str, ...] | None:
    """The parameter names of ``run`` if all are plain (positional or keyword, no default), else None."""
    try:
        return _plain(run)
    except (TypeError, ValueError):
        return None  # unhashable, or no signature: the general path decides


def bind_arguments(run: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Map a call's arguments onto the names of ``run``'s parameters, defaults applied."""
    found = signature(run)
    bound = found.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    for name, param in found.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD and name in arguments:
            arguments.update(arguments.pop(name))
    return arguments


def passed_arguments(
    run: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The arguments a call passed, by parameter name, leaving out those equal to their default."""
    # Defaults are not the caller's: a deploy adding an optional parameter must keep old messages'
    # fingerprints, and passing a default explicitly is the same call as leaving it out.
    names = _plain_names(run)
    if names is not None and len(args) <= len(names) and kwargs.keys() <= set(names[len(args) :]):
        return {**dict(zip(names, args, strict=False)), **kwargs}  # bind_partial, without binding
    found = signature(run)
    arguments = dict(found.bind_partial(*args, **kwargs).arguments)
    for name, param in found.parameters.items():
        if name not in arguments:
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name))
        elif _is_default(arguments[name], param.default):
            del arguments[name]
    return arguments


def _is_default(value: Any, default: Any) -> bool:
    if default is inspect.Parameter.empty:
        return False
    if type(default) is tuple and type(value) is list:
        # JSON has no tuple: a tuple default passed explicitly arrives from the broker as a list.
        default = _listed(default)
    if type(value) is not type(default):
        return False
    try:
        return bool(value == default)
    except Exception:  # an argument whose == raises is simply not the default
        return False


def _listed(value: Any) -> Any:
    """``value`` with its tuples turned into lists, as a JSON round trip returns it."""
    if isinstance(value, (tuple, list)):
        return [_listed(item) for item in value]
    return value


def derive_key(
    source: KeySource,
    task_name: str,
    run: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> str:
    """Build a key from a task's template or callable and the call's arguments."""
    if callable(source):
        return validate_key(source(*args, **kwargs))
    try:
        key = source.format(**bind_arguments(run, args, kwargs))
    # Arguments arrive as JSON values: {order.id} on a dict is an AttributeError, {amount:d} on
    # a str a ValueError. validate_key() stays outside: its InvalidIdempotencyKey is a ValueError.
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise MissingIdempotencyKey(
            f"Task {task_name!r} could not derive its idempotency key from the template "
            f"{source!r}: {error_repr(exc)}. Pass idempotency_key=... or fix the template."
        ) from exc
    return validate_key(key)


def missing_key_error(task_name: str) -> MissingIdempotencyKey:
    """The error for a call that names no key and whose task derives none."""
    return MissingIdempotencyKey(
        f"Task {task_name!r} needs an idempotency key: call it with "
        f'idempotency_key="..." or declare idempotency_key="template-{{arg}}" on the task.'
    )


class _FingerprintEncoder(DjangoJSONEncoder):
    """DjangoJSONEncoder with datetimes and times to the microsecond (it cuts them to milliseconds)."""

    def default(self, o: Any) -> Any:
        if isinstance(o, (datetime.datetime, datetime.time)):
            return o.isoformat()
        if isinstance(o, (bytes, bytearray, memoryview)):
            raise TypeError("bytes are not JSON text; pass a str (for example base64 of the bytes)")
        return super().default(o)


_FINGERPRINT_JSON = _FingerprintEncoder(sort_keys=True, separators=(",", ":"))  # stateless: shared


def fingerprint(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """sha256 of the call's arguments (the key itself excluded); TypeError if one is not JSON."""
    value = [list(args), {k: v for k, v in kwargs.items() if k != "idempotency_key"}]
    return hashlib.sha256(_FINGERPRINT_JSON.encode(value).encode()).hexdigest()


def digest(scope: str, key: str, *parts: str) -> str:
    """A stable hex digest of a scoped key and extra parts; user text never forms a pattern."""
    return hashlib.sha256("\x00".join((scope, key, *parts)).encode()).hexdigest()


def subkey(scope: str, key: str, name: str) -> str:
    """A stable key derived for a downstream call (a payment provider's idempotency key)."""
    return f"idem-{digest(scope, key, 'subkey', name)[:40]}"


def lock_name(scope: str, key: str) -> str:
    """The Redis key of a scoped key's lock: hashed and prefixed."""
    return f"django_idempotent_tasks:lock:{digest(scope, key)}"


def loggable(key: str) -> str:
    """A key shortened for log lines, since keys may carry personal data."""
    return key if len(key) <= 24 else f"{key[:16]}…{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def validate_step_name(name: object) -> str:
    """Return ``name`` if it can name a checkpointed step, else raise ``ValueError``."""
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise ValueError(f"A step name must be a non-empty str of at most 100 characters, got {name!r}.")
    if any(unicodedata.category(char) == "Cc" for char in name):
        raise ValueError(f"A step name must not contain control characters, got {name!r}.")
    return name
