"""What every section measures on: the database of DATABASE_URL, created when missing and migrated,
and the Redis of REDIS_URL; a URL the benchmarks cannot use stops them at once, with the reason."""

from __future__ import annotations

import functools
import warnings
from urllib.parse import SplitResult

import redis
from django.core.management import call_command
from django.db import DatabaseError, connection

from benchmarks import settings


def unusable(what: str, exc: BaseException) -> SystemExit:
    """The exit of a run that cannot use ``what``: status 1 and the driver's reason on stderr."""
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return SystemExit(f"benchmarks: cannot use {what}: {reason}")


def shown(url: SplitResult) -> str:
    """A URL without its password."""
    netloc = url.netloc.rpartition("@")[2]
    return url._replace(netloc=f"{url.username}@{netloc}" if url.username else netloc).geturl()


def _create_if_missing() -> None:
    """Create the database of DATABASE_URL on its server, as purge_timing does, when it is missing."""
    name = connection.settings_dict["NAME"]
    # The server's maintenance database (postgres) or none (MySQL): Django's own way in for CREATE.
    with connection._nodb_cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            if cursor.fetchone() is None:
                print(f"Creating the database {name!r}.", flush=True)
                cursor.execute(f'CREATE DATABASE "{name}"')
        else:
            cursor.execute("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", [name])
            if cursor.fetchone() is None:
                print(f"Creating the database {name!r}.", flush=True)
                cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")


@functools.cache
def ready() -> None:
    """Create the database when missing, migrate it, and reach Redis; exits with the reason otherwise."""
    for role, redis_url in (("broker", settings.BROKER_URL), ("locks", settings.LOCK_REDIS_URL)):
        try:
            redis.Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=5).ping()
        except redis.RedisError as exc:
            raise unusable(f"the {role} Redis {redis_url}", exc) from exc
    try:
        with warnings.catch_warnings():
            # Django warns, then retries on the database itself, when the server's own "postgres"
            # database refuses us; the error of that retry is the one to report.
            warnings.simplefilter("ignore", RuntimeWarning)
            _create_if_missing()
        connection.ensure_connection()
        call_command("migrate", verbosity=0)
    except DatabaseError as exc:
        raise unusable(f"DATABASE_URL={shown(settings.DATABASE_URL)}", exc) from exc
