"""Target of the spawned test processes; it imports Django's models only after setting Django up."""

from __future__ import annotations

import os
from typing import Any


def call(env: dict[str, str], name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Set Django up on the test database, then call one function of tests.testapp.functions."""
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connections

    from tests.testapp import functions

    getattr(functions, name)(*args, **kwargs)
    connections.close_all()
