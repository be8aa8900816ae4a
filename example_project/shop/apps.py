from __future__ import annotations

from typing import Any

import django
from django.apps import AppConfig
from django.conf import settings
from django.db.backends.signals import connection_created


class ShopConfig(AppConfig):
    name = "shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from shop import receivers

        receivers.connect()
        if django.VERSION < (5, 1):  # settings.py sets both through OPTIONS on newer versions
            connection_created.connect(_sqlite_wal_immediate, weak=False)
        if settings.SHOP_DEMO_HOOKS:
            from shop.demo import hooks

            hooks.connect()


def _sqlite_wal_immediate(sender: Any = None, connection: Any = None, **_: Any) -> None:
    """WAL and ``BEGIN IMMEDIATE`` on SQLite, as Django 5.1's ``transaction_mode`` gives."""
    # The demo's workers write concurrently. A deferred transaction that must wait for the write
    # lock finds its snapshot stale once it gets it and fails at once with "database is locked",
    # whatever the timeout; BEGIN IMMEDIATE waits for the lock before it reads anything.
    if connection is None or connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")

    def begin_immediate() -> None:
        connection.cursor().execute("BEGIN IMMEDIATE")

    connection._start_transaction_under_autocommit = begin_immediate
