"""Settings of the example project, each read from an environment variable with a local default.

``DATABASE_URL``: ``sqlite:////absolute/path.sqlite3`` or ``postgres://user:password@host:port/name``
(default: ``db.sqlite3`` next to manage.py). ``REDIS_URL``: ``redis://host:port[/n]`` (default
``redis://127.0.0.1:6379``); the broker uses database n (default 0), the lock cache n + 1 and the
results n + 2, so that a lock fault never touches a queued message.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import urlsplit

import django

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _database(url: str | None) -> dict[str, object]:
    if not url:
        url = f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        options: dict[str, object] = {"timeout": 60}  # several worker processes write at once
        if django.VERSION >= (5, 1):
            # BEGIN IMMEDIATE waits for the write lock (up to the timeout) instead of failing when a
            # read transaction upgrades; WAL lets the demo read while a worker writes.
            options["transaction_mode"] = "IMMEDIATE"
            options["init_command"] = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
        name = "/" + url.split("://", 1)[1].lstrip("/")
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": name, "OPTIONS": options}
    if parts.scheme in ("postgres", "postgresql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": parts.path.lstrip("/"),
            "USER": parts.username or "",
            "PASSWORD": parts.password or "",
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
        }
    raise ValueError(f"DATABASE_URL must start with sqlite:// or postgres://, got {url!r}.")


def _redis(url: str, offset: int) -> str:
    parts = urlsplit(url)
    base = parts.path.strip("/")
    return f"{parts.scheme}://{parts.netloc}/{(int(base) if base else 0) + offset}"


SECRET_KEY = os.environ.get("SECRET_KEY", "example-project-not-secret")
DEBUG = os.environ.get("DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1").split(",")
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "example_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_idempotent_tasks",
    "shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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

DATABASES = {"default": _database(os.environ.get("DATABASE_URL"))}

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": _redis(REDIS_URL, 1),
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 2},
    }
}
IDEMPOTENT_TASKS_CACHE = "default"

CELERY_BROKER_URL = _redis(REDIS_URL, 0)
CELERY_RESULT_BACKEND = _redis(REDIS_URL, 2)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_RESULT_EXPIRES = 3600
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Above the longest task plus its lock TTL; the demo lowers it to show a redelivery.
    "visibility_timeout": _env_int("CELERY_VISIBILITY_TIMEOUT", 3600),
    "unacked_restore_interval": _env_int("CELERY_UNACKED_RESTORE_INTERVAL", 10),
    "unacked_restore_throttle": _env_int("CELERY_UNACKED_RESTORE_THROTTLE", 10),
    # Names this process's broker connections in CLIENT LIST (the demo's lost-ack scenario
    # finds a worker's connections by it; pool children inherit their parent's name).
    "client_name": f"example_project-{os.getpid()}",
}

# django.tasks (Django 6, or the django-tasks backport) runs shop/receipts.py at once, beside Celery.
_TASKS = "django.tasks" if find_spec("django.tasks") else "django_tasks"
TASKS = {"default": {"BACKEND": f"{_TASKS}.backends.immediate.ImmediateBackend"}}

# The demo's workers set this: they record every delivery and obey the demo's fault injections.
SHOP_DEMO_HOOKS = os.environ.get("SHOP_DEMO_HOOKS") == "1"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_idempotent_tasks": {"handlers": ["console"], "level": "INFO"}},
}
