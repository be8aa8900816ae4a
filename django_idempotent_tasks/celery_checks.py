"""System checks of the Celery app that the idempotent tasks are bound to (never one we create)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.apps import apps as django_apps
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, DatabaseError, router
from django.utils.module_loading import autodiscover_modules

from django_idempotent_tasks import compat, options
from django_idempotent_tasks.checks import PREFIX, lock_cache
from django_idempotent_tasks.models import IdempotencyRecord

PICKLE = {"pickle", "application/x-python-serialize"}
REDIS_SCHEMES = {"redis", "rediss", "unix", "redis+socket"}
# kombu's defaults for the transports that redeliver an unacknowledged message after a timeout;
# sentinel:// is the Redis transport behind Sentinel. (RabbitMQ has no such timeout.)
DEFAULT_VISIBILITY_TIMEOUT = {
    **dict.fromkeys(REDIS_SCHEMES, 3600),
    "sentinel": 3600,
    "sqs": 1800,
}
_BROKER_NAMES = {"sentinel": "Redis Sentinel", "sqs": "SQS"}


def find_app() -> Any:
    """Celery's current app, else the one app holding idempotent tasks, else the only app; or None."""
    current = compat.current_app()
    if current is not None:
        return current
    bound = options.apps_with_bound_tasks()
    if len(bound) == 1:
        return bound.pop()
    apps = compat.active_apps()
    return apps[0] if len(apps) == 1 else None


def idempotent_tasks(app: Any) -> list[Any]:
    """The idempotent tasks bound to ``app``, by name."""
    registry = compat.registered_tasks(app)
    return [registry[name] for name in options.bound_tasks(app) if name in registry]


def check_celery_app(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E003, W001 to W004 and W006: the Celery settings that the guarantee relies on."""
    autodiscover_modules("tasks")  # what app.autodiscover_tasks() imports, so that every task is seen
    app = find_app()
    if app is None:
        return []
    tasks = idempotent_tasks(app)
    return [
        *_pickle(app),
        *_late_ack(app, tasks, "acks_late", "task_acks_late", "W001", _ACKS_LATE),
        *_late_ack(app, tasks, "reject_on_worker_lost", "task_reject_on_worker_lost", "W002", _REJECT),
        *_visibility_timeout(app, tasks),
        *(message for task in tasks for message in _time_limit(app, task)),
        *_shared_redis(app),
    ]


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _effective(app: Any, task: Any, attribute: str, setting: str) -> Any:
    value = getattr(task, attribute, None)
    return app.conf[setting] if value is None else value


def _pickle(app: Any) -> list[checks.CheckMessage]:
    accepted = list(app.conf.accept_content or [])
    if not PICKLE & set(accepted):
        return []
    return [
        checks.Error(
            f"The Celery app {app.main!r} accepts pickle (accept_content={accepted!r}): anyone who can "
            "write to the broker can run code in the workers.",
            hint='Set CELERY_ACCEPT_CONTENT = ["json"]; idempotent tasks send and store JSON only.',
            id=f"{PREFIX}.E003",
        )
    ]


_ACKS_LATE = "a worker that dies mid-task has already acknowledged the message, so the task is lost"
_REJECT = "a worker process killed mid-task (SIGKILL, out of memory) gets its message acknowledged, so the task is lost"


def _late_ack(
    app: Any, tasks: list[Any], attribute: str, setting: str, code: str, why: str
) -> list[checks.CheckMessage]:
    off = [task for task in tasks if not _effective(app, task, attribute, setting)]
    if not app.conf[setting]:
        if tasks and not off:
            return []  # every idempotent task turns it on itself
        return [
            checks.Warning(
                f"{setting} is off in the Celery app {app.main!r}: {why} instead of delivered again.",
                hint=f"Set CELERY_{setting.upper()} = True.",
                id=f"{PREFIX}.{code}",
            )
        ]
    return [
        checks.Warning(
            f"Idempotent task {task.name!r} sets {attribute}=False: {why} instead of delivered again.",
            hint=f"Remove {attribute}=False from the task.",
            id=f"{PREFIX}.{code}",
        )
        for task in off
    ]


def _lock_ttl(task: Any) -> int:
    return int(task.idempotency_options.effective_lock_ttl)


def _broker_url(app: Any) -> str:
    url = app.conf.broker_write_url or app.conf.broker_url or ""
    if isinstance(url, (list, tuple)):
        url = url[0] if url else ""
    return str(url).split(";")[0].strip()


def _visibility_timeout(app: Any, tasks: list[Any]) -> list[checks.CheckMessage]:
    scheme = urlsplit(_broker_url(app)).scheme
    if scheme not in DEFAULT_VISIBILITY_TIMEOUT or not tasks:
        return []
    options = app.conf.broker_transport_options or {}
    timeout = options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT[scheme])
    limits = [(_lock_ttl(task), "lock_ttl", task.name) for task in tasks]
    limits += [
        (limit, "time_limit", task.name)
        for task in tasks
        if (limit := _effective(app, task, "time_limit", "task_time_limit"))
    ]
    needed, what, name = max(limits, key=lambda limit: limit[0])
    if timeout > needed:
        return []
    return [
        checks.Warning(
            f"The {_BROKER_NAMES.get(scheme, 'Redis')} broker's visibility_timeout ({_seconds(timeout)}) "
            f"is not above the {what} of "
            f"idempotent task {name!r} ({_seconds(needed)}): the broker delivers the message again to "
            "another worker while the first delivery still runs.",
            hint=f'Set CELERY_BROKER_TRANSPORT_OPTIONS = {{"visibility_timeout": ...}} above {_seconds(needed)}.',
            id=f"{PREFIX}.W003",
        )
    ]


def _time_limit(app: Any, task: Any) -> list[checks.CheckMessage]:
    # A claim sets expires_at to claim time + record_ttl; past it, only the renewed lease keeps a
    # running delivery's record from being purged. The last lease a run can hold ends at most
    # time_limit + lock_ttl after the claim, so the record's retention must reach beyond that.
    limit = _effective(app, task, "time_limit", "task_time_limit")
    lock_ttl, record_ttl = _lock_ttl(task), int(task.idempotency_options.effective_record_ttl)
    if not limit or limit + lock_ttl <= record_ttl:
        return []
    return [
        checks.Warning(
            f"Idempotent task {task.name!r} has time_limit {_seconds(limit)}, more than its record_ttl "
            f"({_seconds(record_ttl)}) minus one lock_ttl ({_seconds(lock_ttl)}): a run that long outlives "
            "its record's expires_at, so one missed lease renewal lets the purge delete the record "
            "under it and the key can run again.",
            hint=f"Raise record_ttl to at least time_limit + lock_ttl ({_seconds(limit + lock_ttl)}), "
            "or lower time_limit.",
            id=f"{PREFIX}.W004",
        )
    ]


def _redis_database(url: str) -> tuple[str, int] | None:
    """(server, database number) of a Redis URL, or None if it is not one."""
    parts = urlsplit(url)
    if parts.scheme not in REDIS_SCHEMES:
        return None
    query = parse_qs(parts.query)
    if parts.scheme in {"unix", "redis+socket"}:
        server = parts.path
        number = (query.get("db") or query.get("virtual_host") or ["0"])[0]
    else:
        host = parts.hostname or "localhost"
        server = f"{'127.0.0.1' if host == 'localhost' else host}:{parts.port or 6379}"
        number = parts.path.strip("/") or (query.get("db") or ["0"])[0]
    return (server, int(number)) if number.isdigit() else None


def _shared_redis(app: Any) -> list[checks.CheckMessage]:
    found = lock_cache()
    broker = _redis_database(_broker_url(app))
    if found is None or broker is None:
        return []
    alias, cache = found
    location = cache.get("LOCATION", "")
    locations = location if isinstance(location, (list, tuple)) else str(location).split(",")
    if broker not in {_redis_database(str(url).strip()) for url in locations}:
        return []
    return [
        checks.Warning(
            f"The lock cache {alias!r} and the Celery broker use the same Redis database "
            f"({broker[0]}/{broker[1]}): clearing or evicting the locks there loses queued messages too.",
            hint="Give the locks another database number or a Redis of their own.",
            id=f"{PREFIX}.W006",
        )
    ]


PURGE_TASK = "django_idempotent_tasks.purge_expired_records"


def check_purge_scheduled(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W009 (deploy): a celery beat schedule runs purge_expired_records, or expired records pile up."""
    app = find_app()
    if app is None:
        return []
    scheduled = {entry.get("task") for entry in (app.conf.beat_schedule or {}).values()}
    if PURGE_TASK in scheduled or _in_beat_database(PURGE_TASK):
        return []
    return [
        checks.Warning(
            f"No celery beat schedule entry runs {PURGE_TASK!r}: expired idempotency records are never "
            "deleted and the table grows without bound.",
            hint=f'Add an entry with "task": {PURGE_TASK!r} to beat_schedule (CELERY_BEAT_SCHEDULE), or a '
            "periodic task in django-celery-beat, or run purge_idempotency_records from cron and silence "
            f"{PREFIX}.W009.",
            id=f"{PREFIX}.W009",
        )
    ]


REDRIVE_TASK = "django_idempotent_tasks.redrive_pending_records"


def check_redrive_scheduled(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W012 (deploy): outbox tasks exist and no celery beat schedule runs redrive_pending_records."""
    app = find_app()
    if app is None:
        return []
    outbox_tasks = outbox_task_names(app)
    if not outbox_tasks:
        return []
    scheduled = {entry.get("task") for entry in (app.conf.beat_schedule or {}).values()}
    if REDRIVE_TASK in scheduled or _in_beat_database(REDRIVE_TASK):
        return []
    return [
        checks.Warning(
            f"No celery beat schedule entry runs {REDRIVE_TASK!r}, and {len(outbox_tasks)} task(s) use the "
            f"outbox ({', '.join(outbox_tasks[:3])}{', …' if len(outbox_tasks) > 3 else ''}): a message the "
            "broker lost or a publish that failed leaves its record PENDING and nothing sends it again.",
            hint=f'Add an entry with "task": {REDRIVE_TASK!r} to beat_schedule (CELERY_BEAT_SCHEDULE), every '
            "few minutes, or a periodic task in django-celery-beat, or run redrive_idempotency_records "
            f"from cron and silence {PREFIX}.W012.",
            id=f"{PREFIX}.W012",
        )
    ]


def outbox_task_names(app: Any) -> list[str]:
    """The names of the app's idempotent tasks that use the outbox."""
    autodiscover_modules("tasks")
    return [task.name for task in idempotent_tasks(app) if task.idempotency_options.effective_outbox]


def check_outbox_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W013 (deploy): outbox tasks write their PENDING records to another database than the default one,
    where the callers' transactions usually are: the record cannot commit or roll back with them."""
    app = find_app()
    alias = router.db_for_write(IdempotencyRecord)
    if app is None or alias == DEFAULT_DB_ALIAS:
        return []
    outbox_tasks = outbox_task_names(app)
    if not outbox_tasks:
        return []
    return [
        checks.Warning(
            f"{len(outbox_tasks)} task(s) use the outbox ({', '.join(outbox_tasks[:3])}"
            f"{', …' if len(outbox_tasks) > 3 else ''}), and your routers write the idempotency "
            f"records to the database {alias!r}: a call made in a transaction on {DEFAULT_DB_ALIAS!r} "
            "writes its PENDING record (and publishes) whether that transaction commits or rolls back.",
            hint="Write the records to the database of your callers' transactions (route the "
            "django_idempotent_tasks app there), or silence this if your callers' transactions are on "
            f"{alias!r}.",
            id=f"{PREFIX}.W013",
        )
    ]


def _in_beat_database(task: str) -> bool:
    """Whether django-celery-beat's database scheduler (if installed) has ``task`` enabled."""
    if not django_apps.is_installed("django_celery_beat"):
        return False
    # Looked up by name: django-celery-beat is optional, never a dependency.
    model = "django_celery_beat.PeriodicTask"  # a variable, so that django-stubs does not resolve it
    periodic_task: Any = django_apps.get_model(model)
    try:
        return bool(periodic_task.objects.filter(task=task, enabled=True).exists())
    except DatabaseError:  # not migrated yet: nothing is scheduled there
        return False


def check_db_reuse(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W010 (deploy): without CELERY_DB_REUSE_MAX, Celery reconnects to the database for every task."""
    app = find_app()
    if app is None or app.conf.get("CELERY_DB_REUSE_MAX"):
        return []
    return [
        checks.Warning(
            "CELERY_DB_REUSE_MAX is not set: Celery's Django fix-up closes the database connections "
            "before and after every task (Celery 5.7 whatever CONN_MAX_AGE says), so every idempotent "
            "task opens a new connection before its first query, which costs more than the task's "
            "own round trips (make bench prints how much).",
            hint="Set CELERY_DB_REUSE_MAX = 1000 in the settings your Celery app reads (Celery then "
            "closes connections every 1000 tasks), with CONN_MAX_AGE and a task_prerun receiver "
            "calling close_old_connections() to drop broken ones (docs/scale.md, PostgreSQL connections).",
            id=f"{PREFIX}.W010",
        )
    ]
