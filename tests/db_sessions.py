"""Server sessions of the test database, on PostgreSQL and MySQL/MariaDB: whose, and how to kill one."""

from __future__ import annotations

from django.db import connection

# A session's id, killing one (True if it existed), and every other session of this database.
_SQL = {
    "postgresql": (
        "SELECT pg_backend_pid()",
        "SELECT pg_terminate_backend(%s)",
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    ),
    "mysql": (
        "SELECT CONNECTION_ID()",
        "KILL CONNECTION %s",
        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
    ),
}


def backend_id() -> int:
    """The server's id of this process's session."""
    with connection.cursor() as cursor:
        cursor.execute(_SQL[connection.vendor][0])
        return int(cursor.fetchone()[0])


def terminate(backend: int) -> bool:
    """End the session ``backend`` (its open transaction rolls back); False if it was gone."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_SQL["postgresql"][1], [backend])
            return bool(cursor.fetchone()[0])
        try:
            cursor.execute(_SQL[connection.vendor][1], [backend])
        except Exception as exc:  # MySQL: "Unknown thread id" for a session already gone
            if "nknown thread" in str(exc):
                return False
            raise
        return True


def other_backends() -> list[int]:
    """The sessions of this database other than this process's own."""
    with connection.cursor() as cursor:
        cursor.execute(_SQL[connection.vendor][2])
        return [int(row[0]) for row in cursor.fetchall()]


def cut_when_idle() -> None:
    """Make the server drop this session after 1 s idle (P7: a pooler's timeout, a failover)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET idle_session_timeout = '1s'")
        elif connection.vendor == "mysql":
            cursor.execute("SET SESSION wait_timeout = 1")
