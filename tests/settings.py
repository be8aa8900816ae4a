"""Settings of the test suite: real PostgreSQL and Redis, read from DATABASE_URL and REDIS_URL."""

from __future__ import annotations

import os
from importlib.util import find_spec
from typing import Any
from urllib.parse import SplitResult, urlsplit

import django

from tests import isolation

DATABASE_URL = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"))
# The run's own Redis server (tests/isolation.py): databases 11 to 14 hold its broker, locks,
# results and control keys, and are flushed before every test.
REDIS_URL = isolation.redis_url()
# Worker subprocesses run against the database pytest-django created; the suite passes its name.
TEST_DATABASE_NAME = os.environ.get("IDEMPOTENT_TESTS_DATABASE_NAME")

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_idempotent_tasks",
    "tests.testapp",
    "tests.chaosapp",
    "django_tasks_db",
]
if find_spec("django_celery_beat"):  # W009's database scheduler branch (not on Django 6.1: unsupported)
    INSTALLED_APPS.append("django_celery_beat")
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"


# Worker processes share the file: wait for its write lock instead of failing at once, and (Django
# 5.1+) take it when a transaction begins, since upgrading a read to a write cannot wait under WAL.
# conftest.py turns WAL on in the test database (readers then never wait for the writer).
SQLITE_OPTIONS: dict[str, Any] = {"timeout": 30}
if django.VERSION >= (5, 1):
    SQLITE_OPTIONS.update(transaction_mode="IMMEDIATE", init_command="PRAGMA journal_mode=WAL")


# make test-server-binding: psycopg 3 binds the parameters on the server (Django's
# "server_side_binding"), as a project away from PgBouncer may choose (docs/deployment.md).
SERVER_SIDE_BINDING = os.environ.get("IDEMPOTENT_TESTS_SERVER_SIDE_BINDING") == "1"


def database_from_url(url: SplitResult, name: str | None) -> dict[str, Any]:
    """Django's DATABASES entry for a postgres://, mysql:// (MariaDB) or sqlite:/// URL."""
    scheme = url.scheme.split("+")[0]
    if scheme == "sqlite":
        path = url.path or "/tmp/idempotent-tests.sqlite3"
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name or path,
            "TEST": {"NAME": name or f"{path}-test-{isolation.run_id()}"},
            "OPTIONS": SQLITE_OPTIONS,
        }
    if scheme in {"mysql", "mariadb"}:
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": name or url.path.lstrip("/") or "test",
            "TEST": {"NAME": name or isolation.test_database_name(url.path.lstrip("/") or "test")},
            "USER": url.username or "root",
            "PASSWORD": url.password or "",
            # localhost (the default) means the server's Unix socket, where root needs no password.
            "HOST": url.hostname or "localhost",
            "PORT": str(url.port or ""),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    if scheme not in {"postgres", "postgresql"}:
        raise ValueError(f"DATABASE_URL: unsupported scheme {url.scheme!r} (postgres, mysql or sqlite)")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "OPTIONS": {"server_side_binding": SERVER_SIDE_BINDING},
        "NAME": name or url.path.lstrip("/") or "test",
        "TEST": {"NAME": name or isolation.test_database_name(url.path.lstrip("/") or "test")},
        "USER": url.username or "postgres",
        "PASSWORD": url.password or "",
        "HOST": url.hostname or "127.0.0.1",
        "PORT": str(url.port or 5432),
    }


DATABASES = {"default": database_from_url(DATABASE_URL, TEST_DATABASE_NAME)}
# A second database for the router tests (tests/test_routers.py), created only when a test asks
# for it: a "read replica" that never receives the records, so a read or write routed there shows.
_TEST_NAME = DATABASES["default"]["TEST"]["NAME"]
DATABASES["replica"] = {**DATABASES["default"], "TEST": {"NAME": f"{_TEST_NAME}_replica"}}

LOCK_REDIS_URL = os.environ.get("IDEMPOTENT_TESTS_LOCK_REDIS_URL", f"{REDIS_URL}/12")
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "locks": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": LOCK_REDIS_URL,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 2},
    },
}
IDEMPOTENT_TASKS_CACHE = "locks"

CELERY_BROKER_URL = os.environ.get("IDEMPOTENT_TESTS_BROKER_URL", f"{REDIS_URL}/11")
if CELERY_BROKER_URL.startswith(("amqp://", "pyamqp://")):  # the run's own vhost: <vhost>-<run id>
    CELERY_BROKER_URL = isolation.vhost_url(CELERY_BROKER_URL)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_RESULT_BACKEND = os.environ.get("IDEMPOTENT_TESTS_RESULT_URL", f"{REDIS_URL}/13")
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
if os.environ.get("IDEMPOTENT_TESTS_QUEUE_TYPE"):  # "quorum": RabbitMQ's replicated queues (Celery 5.5+)
    CELERY_TASK_DEFAULT_QUEUE_TYPE = os.environ["IDEMPOTENT_TESTS_QUEUE_TYPE"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_DB_REUSE_MAX = 1000
# The chaos suite's workers consume only their own queue, never the shared test workers'.
CELERY_TASK_ROUTES = {"chaos.*": {"queue": "chaos"}, "explore.*": {"queue": "explore"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_idempotent_tasks": {"handlers": ["console"], "level": "INFO"}},
}
CONTROL_REDIS_URL = os.environ.get("IDEMPOTENT_TESTS_CONTROL_URL", f"{REDIS_URL}/14")

# django.tasks (Django 6) or its backport django-tasks: run at once, or queued for `db_worker`.
TASKS_FRAMEWORK = "django.tasks" if find_spec("django.tasks") else "django_tasks"
TASKS = {
    "default": {"BACKEND": f"{TASKS_FRAMEWORK}.backends.immediate.ImmediateBackend"},
    "database": {"BACKEND": "django_tasks_db.DatabaseBackend"},
}
