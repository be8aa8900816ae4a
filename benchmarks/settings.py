"""Settings of the benchmarks: real PostgreSQL (or MariaDB, section 1) and Redis, read from
DATABASE_URL and REDIS_URL."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from tests.settings import database_from_url  # one URL parser for the suite and the benchmarks

DATABASE_URL = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"))
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
# One Redis database per role, so that a benchmark can flush its own without touching the others.
BROKER_URL = f"{REDIS_URL}/1"
LOCK_REDIS_URL = f"{REDIS_URL}/2"
PEER_REDIS_URL = f"{REDIS_URL}/3"  # celery-once, celery-singleton and the naive pattern
STATS_REDIS_URL = f"{REDIS_URL}/4"  # side effects counted by the bodies

SECRET_KEY = "benchmarks-only"
DEBUG = False  # DEBUG=True would keep every query in memory
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_idempotent_tasks"]

if DATABASE_URL.scheme.startswith("sqlite"):
    raise ValueError("DATABASE_URL: the benchmarks measure PostgreSQL or MySQL/MariaDB, not SQLite.")


# Every system keeps its connection between tasks (see CELERY_DB_REUSE_MAX below).
DATABASES = {"default": {**database_from_url(DATABASE_URL, None), "CONN_MAX_AGE": None}}
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "locks": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": LOCK_REDIS_URL,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 2},
    },
}
IDEMPOTENT_TASKS_CACHE = "locks"

CELERY_BROKER_URL = BROKER_URL
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Celery's Django fixup closes the database connection after every task unless this is set:
# set for every system alike, so that no system pays a reconnection per task.
CELERY_DB_REUSE_MAX = 1_000_000

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    # Production level: INFO would print a line per replay and measure the terminal.
    "loggers": {"django_idempotent_tasks": {"handlers": ["console"], "level": "WARNING"}},
}
