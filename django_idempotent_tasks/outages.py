"""A records' database that stays unreachable, said out loud: an ERROR and a signal once per lease.

A delivery that loses its database connection is re-queued, which is right for an outage of a few
seconds. When the connections of this process have kept failing for longer than a lease, the
database is more likely gone (dropped, renamed, a wrong password, a server moved) than restarting:
each re-queue would otherwise only log a WARNING, forever. Tracked per process and per database
alias; a connection that opens again ends the outage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.backends.signals import connection_created

from django_idempotent_tasks import signals, store

logger = logging.getLogger("django_idempotent_tasks")


@dataclass
class Outage:
    """Connection failures of one database alias in this process, since the first one."""

    first: float
    reported: float | None = None


_outages: dict[str, Outage] = {}
_lock = threading.Lock()


def connection_failed(exc: BaseException, *, lease_seconds: int, send: Callable[..., Any]) -> None:
    """Note a lost connection of the records' database; past one lease of failures, log an ERROR and
    ``send`` the signal ``database_unreachable``, once per lease."""
    alias, now = store.database(), time.monotonic()
    with _lock:
        # connection_lost() closes the connection, so the next delivery opens a new one: when
        # it opens (connection_opened), the outage is over, however long the re-queues waited.
        outage = _outages.setdefault(alias, Outage(first=now))
        seconds = now - outage.first
        due = seconds >= lease_seconds and (outage.reported is None or now - outage.reported >= lease_seconds)
        if due:
            outage.reported = now
    if not due:
        return
    error = reason(exc)
    logger.error(
        "The database %r of the idempotency records cannot be used: %s (for %d s). Deliveries are "
        "re-queued until it answers; manage.py check --deploy says the same (E005).",
        alias,
        error,
        seconds,
        extra={"database_alias": alias, "database_error": error, "unreachable_seconds": round(seconds)},
    )
    send(signals.database_unreachable, alias=alias, error=error, seconds=seconds)


def reason(exc: BaseException) -> str:
    """The driver's message on one line (the same in the ERROR and in check E005)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def connection_opened(sender: Any, connection: Any, **kwargs: Any) -> None:
    """A new connection of ``connection.alias`` opened: its outage, if any, is over."""
    if _outages:
        with _lock:
            _outages.pop(connection.alias, None)


connection_created.connect(connection_opened, dispatch_uid="django_idempotent_tasks.outages")
