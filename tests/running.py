"""The two ways a test runs something in its own process: a task under a key, a management command."""

from __future__ import annotations

from io import StringIO
from typing import Any

from django.core.management import call_command


def run_task(task: Any, *args: Any, key: str, propagate: bool = True, **kwargs: Any) -> Any:
    """Run ``task`` eagerly under ``key``: its result, its error raised unless ``propagate=False``."""
    return task.apply(args, {**kwargs, "idempotency_key": key}).get(propagate=propagate)


def run_command(*args: str, stdout: StringIO | None = None) -> str:
    """Run a management command: what it wrote, on stdout and stderr, into ``stdout`` if given."""
    out = stdout or StringIO()
    call_command(*args, stdout=out, stderr=out)
    return out.getvalue()
