"""System checks: each ID with its exact message, on real Celery apps and a real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from celery import Celery, _state
from django.conf import settings
from django.core import checks
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from django_idempotent_tasks import celery_checks
from django_idempotent_tasks.checks import TAG, check_lock_cache, check_lock_eviction, check_settings
from django_idempotent_tasks.tasks import IdempotentTask
from tests.helpers import ROOT, redis_down

ID = "django_idempotent_tasks"
LOCKS: Any = settings.CACHES["locks"]
MakeApp = Callable[..., Celery]


@pytest.fixture
def make_app() -> Iterator[MakeApp]:
    """A new Celery app, current while the test runs, configured as the tests' app unless told."""
    previous = _state._tls.current_app  # type: ignore[attr-defined]

    def make(**conf: Any) -> Celery:
        app = Celery("checked")
        app.conf.update(
            broker_url=settings.CELERY_BROKER_URL,
            accept_content=["json"],
            task_acks_late=True,
            task_reject_on_worker_lost=True,
            broker_transport_options={"visibility_timeout": 3600},
        )
        app.conf.update(conf)
        return app

    yield make
    previous.set_current()


def noop() -> None:
    """The body of the tasks that the tests bind to their own apps (never shared with other apps)."""


def celery_messages() -> list[checks.CheckMessage]:
    return celery_checks.check_celery_app()


@pytest.mark.django_db  # check --deploy connects to the records' database (E005)
def test_the_test_settings_pass_every_check() -> None:
    assert checks.run_checks(tags=[TAG], include_deployment_checks=True) == []


def test_e001_lock_cache_missing_or_not_django_redis() -> None:
    hint = (
        'Add a cache with "BACKEND": "django_redis.cache.RedisCache" to CACHES and name it in '
        "IDEMPOTENT_TASKS_CACHE."
    )
    with override_settings(IDEMPOTENT_TASKS_CACHE="nope"):
        assert check_lock_cache() == [
            checks.Error(
                "IDEMPOTENT_TASKS_CACHE is 'nope', but CACHES has no such cache.", hint=hint, id=f"{ID}.E001"
            )
        ]
    with override_settings(IDEMPOTENT_TASKS_CACHE="default"):
        assert check_lock_cache() == [
            checks.Error(
                "IDEMPOTENT_TASKS_CACHE is 'default', which is not a django-redis cache "
                "(backend 'django.core.cache.backends.locmem.LocMemCache').",
                hint=hint,
                id=f"{ID}.E001",
            )
        ]
        assert check_lock_eviction() == []
    builtin = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": LOCKS["LOCATION"]}
    with override_settings(CACHES={**settings.CACHES, "locks": builtin}):
        assert check_lock_cache() == [
            checks.Error(
                "IDEMPOTENT_TASKS_CACHE is 'locks', which is Django's built-in RedisCache "
                "('django.core.cache.backends.redis.RedisCache'): the locks need django-redis (its raw "
                "client runs their Lua scripts).",
                hint=hint,
                id=f"{ID}.E001",
            )
        ]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("IDEMPOTENT_TASKS_LOCK_TTL", 0, "IDEMPOTENT_TASKS_LOCK_TTL must be a positive integer, got 0."),
        (
            "IDEMPOTENT_TASKS_RECORD_TTL",
            "7d",
            "IDEMPOTENT_TASKS_RECORD_TTL must be a positive integer, got '7d'.",
        ),
        ("IDEMPOTENT_TASKS_CACHE", "", "IDEMPOTENT_TASKS_CACHE must be a cache alias (a str), got ''."),
        ("IDEMPOTENT_TASKS_OUTBOX", "yes", "IDEMPOTENT_TASKS_OUTBOX must be True or False, got 'yes'."),
    ],
)
def test_e002_invalid_setting(name: str, value: Any, message: str) -> None:
    with override_settings(**{name: value}):
        assert check_settings() == [
            checks.Error(message, hint="Fix the setting in settings.py.", id=f"{ID}.E002")
        ]
        if name == "IDEMPOTENT_TASKS_CACHE":
            assert check_lock_cache() == check_lock_eviction() == []


def test_e003_pickle_accepted(make_app: MakeApp) -> None:
    make_app(accept_content=["json", "application/x-python-serialize"])
    assert celery_messages() == [
        checks.Error(
            "The Celery app 'checked' accepts pickle (accept_content=['json', "
            "'application/x-python-serialize']): anyone who can write to the broker can run code in the workers.",
            hint='Set CELERY_ACCEPT_CONTENT = ["json"]; idempotent tasks send and store JSON only.',
            id=f"{ID}.E003",
        )
    ]


def test_w001_w002_late_acks_off_in_the_app(make_app: MakeApp) -> None:
    make_app(task_acks_late=False, task_reject_on_worker_lost=False)
    assert celery_messages() == [
        checks.Warning(
            "task_acks_late is off in the Celery app 'checked': a worker that dies mid-task has already "
            "acknowledged the message, so the task is lost instead of delivered again.",
            hint="Set CELERY_TASK_ACKS_LATE = True.",
            id=f"{ID}.W001",
        ),
        checks.Warning(
            "task_reject_on_worker_lost is off in the Celery app 'checked': a worker process killed mid-task "
            "(SIGKILL, out of memory) gets its message acknowledged, so the task is lost instead of delivered "
            "again.",
            hint="Set CELERY_TASK_REJECT_ON_WORKER_LOST = True.",
            id=f"{ID}.W002",
        ),
    ]


def test_w001_w002_turned_off_by_one_task(make_app: MakeApp) -> None:
    app = make_app()
    app.task(
        base=IdempotentTask, shared=False, name="checked.early", acks_late=False, reject_on_worker_lost=False
    )(noop)
    assert celery_messages() == [
        checks.Warning(
            "Idempotent task 'checked.early' sets acks_late=False: a worker that dies mid-task has already "
            "acknowledged the message, so the task is lost instead of delivered again.",
            hint="Remove acks_late=False from the task.",
            id=f"{ID}.W001",
        ),
        checks.Warning(
            "Idempotent task 'checked.early' sets reject_on_worker_lost=False: a worker process killed "
            "mid-task (SIGKILL, out of memory) gets its message acknowledged, so the task is lost instead of "
            "delivered again.",
            hint="Remove reject_on_worker_lost=False from the task.",
            id=f"{ID}.W002",
        ),
    ]


def test_w001_not_raised_when_every_idempotent_task_acks_late(make_app: MakeApp) -> None:
    app = make_app(task_acks_late=False, task_reject_on_worker_lost=False)
    assert len(celery_checks.idempotent_tasks(app)) > 1
    for task in celery_checks.idempotent_tasks(app):
        task.acks_late = task.reject_on_worker_lost = True
    assert celery_messages() == []


def test_w003_visibility_timeout_below_a_lock_ttl_or_time_limit(make_app: MakeApp) -> None:
    app = make_app(broker_transport_options={"visibility_timeout": 60})
    assert celery_messages() == [
        checks.Warning(
            "The Redis broker's visibility_timeout (60 s) is not above the lock_ttl of idempotent task "
            "'tests.testapp.tasks.atomic_effect' (60 s): the broker delivers the message again to another "
            "worker while the first delivery still runs.",
            hint='Set CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": ...} above 60 s.',
            id=f"{ID}.W003",
        )
    ]
    app.task(base=IdempotentTask, shared=False, name="checked.long", time_limit=5401)(noop)
    assert celery_messages() == [
        checks.Warning(
            "The Redis broker's visibility_timeout (60 s) is not above the time_limit of idempotent task "
            "'checked.long' (5401 s): the broker delivers the message again to another worker while the "
            "first delivery still runs.",
            hint='Set CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": ...} above 5401 s.',
            id=f"{ID}.W003",
        )
    ]


def test_w003_only_for_a_redis_broker(make_app: MakeApp) -> None:
    make_app(broker_url="amqp://guest@127.0.0.1//", broker_transport_options={"visibility_timeout": 1})
    assert celery_messages() == []


@pytest.mark.parametrize(
    ("url", "broker", "default"),
    [
        ("sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380", "Redis Sentinel", 3600),
        ("sqs://", "SQS", 1800),
    ],
)
def test_w003_sentinel_and_sqs_brokers(make_app: MakeApp, url: str, broker: str, default: int) -> None:
    app = make_app(broker_url=url, broker_transport_options={})
    app.task(base=IdempotentTask, shared=False, name="checked.long", time_limit=default)(noop)
    assert celery_messages() == [
        checks.Warning(
            f"The {broker} broker's visibility_timeout ({default} s) is not above the time_limit of idempotent "
            f"task 'checked.long' ({default} s): the broker delivers the message again to another worker while "
            "the first delivery still runs.",
            hint=f'Set CELERY_BROKER_TRANSPORT_OPTIONS = {{"visibility_timeout": ...}} above {default} s.',
            id=f"{ID}.W003",
        )
    ]
    app.conf.broker_transport_options = {"visibility_timeout": default + 1}
    assert celery_messages() == []


def test_w004_time_limit_beyond_the_record_ttl(make_app: MakeApp) -> None:
    app = make_app(task_time_limit=3000)
    app.task(base=IdempotentTask, shared=False, name="checked.kept", record_ttl=3060)(noop)
    app.task(base=IdempotentTask, shared=False, name="checked.short", record_ttl=3059)(noop)
    assert celery_messages() == [
        checks.Warning(
            "Idempotent task 'checked.short' has time_limit 3000 s, more than its record_ttl (3059 s) minus "
            "one lock_ttl (60 s): a run that long outlives its record's expires_at, so one missed lease "
            "renewal lets the purge delete the record under it and the key can run again.",
            hint="Raise record_ttl to at least time_limit + lock_ttl (3060 s), or lower time_limit.",
            id=f"{ID}.W004",
        )
    ]


def test_w005_lock_cache_without_socket_timeout() -> None:
    with override_settings(CACHES={**settings.CACHES, "locks": {**LOCKS, "OPTIONS": {}}}):
        assert check_lock_cache() == [
            checks.Warning(
                "The lock cache 'locks' has no SOCKET_TIMEOUT: when its Redis stops answering, idempotent "
                "tasks hang on the lock instead of failing and being retried.",
                hint='Add "SOCKET_TIMEOUT": 5 and "SOCKET_CONNECT_TIMEOUT": 5 to CACHES[\'locks\']["OPTIONS"].',
                id=f"{ID}.W005",
            )
        ]


def test_w006_lock_cache_and_broker_on_one_redis_database(make_app: MakeApp) -> None:
    port = settings.LOCK_REDIS_URL.rsplit(":", 1)[1].split("/")[0]
    make_app(broker_url=f"redis://localhost:{port}/12")
    assert celery_messages() == [
        checks.Warning(
            "The lock cache 'locks' and the Celery broker use the same Redis database "
            f"(127.0.0.1:{port}/12): clearing or evicting the locks there loses queued messages too.",
            hint="Give the locks another database number or a Redis of their own.",
            id=f"{ID}.W006",
        )
    ]
    make_app(broker_url=f"redis://localhost:{port}/13")
    assert celery_messages() == []


@pytest.fixture
def evicting_redis(lock_redis: redis.Redis) -> Iterator[None]:
    before: Any = lock_redis.config_get("maxmemory*")
    lock_redis.config_set("maxmemory", 512 * 1024 * 1024)
    lock_redis.config_set("maxmemory-policy", "allkeys-lru")
    yield
    lock_redis.config_set("maxmemory-policy", before["maxmemory-policy"])
    lock_redis.config_set("maxmemory", before["maxmemory"])


@pytest.mark.django_db  # check --deploy connects to the records' database (E005)
def test_w007_lock_redis_can_evict_only_under_deploy(evicting_redis: None) -> None:
    expected = checks.Warning(
        "The lock Redis (cache 'locks') has maxmemory 536870912 with maxmemory-policy allkeys-lru: once full "
        "it evicts keys, locks included, and duplicate deliveries then rely on the database lease alone. "
        "(Read from the live Redis by check --deploy.)",
        hint="Set maxmemory-policy noeviction on the lock Redis, or give the locks a Redis of their own.",
        id=f"{ID}.W007",
    )
    assert checks.run_checks(tags=[TAG]) == []
    assert checks.run_checks(tags=[TAG], include_deployment_checks=True) == [expected]
    out, err = StringIO(), StringIO()
    call_command("check", "--deploy", "--tag", TAG, stdout=out, stderr=err)
    assert (out.getvalue(), err.getvalue()) == (
        "",
        "System check identified some issues:\n\nWARNINGS:\n"
        f"?: ({ID}.W007) {expected.msg}\n\tHINT: {expected.hint}\n\n"
        "System check identified 1 issue (0 silenced).\n",
    )


def test_w007_redis_error_is_a_warning() -> None:
    with redis_down():
        assert check_lock_eviction() == [
            checks.Warning(
                "Could not read the maxmemory-policy of the lock Redis (cache 'locks'): Error 111 connecting "
                "to 127.0.0.1:1. Connection refused. This deploy check needs a live Redis.",
                hint="Run check --deploy where the lock Redis answers, and make sure its maxmemory-policy is "
                "noeviction.",
                id=f"{ID}.W007",
            )
        ]


def test_checks_never_create_a_celery_app() -> None:
    script = (
        "import django; django.setup()\n"
        "from django.core.checks import run_checks\n"
        "from celery import _state\n"
        "print([m.id for m in run_checks(tags=['django_idempotent_tasks'])])\n"
        "print(len(_state._get_active_apps()), _state.default_app)\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": "/usr/bin:/bin", **_service_env()},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert output == "[]\n0 None\n"


def _service_env() -> dict[str, str]:
    names = ("DATABASE_URL", "REDIS_URL", "IDEMPOTENT_TESTS_REDIS_URL", "IDEMPOTENT_TESTS_RUN_ID")
    return {name: os.environ[name] for name in names if name in os.environ}


@pytest.mark.parametrize(
    ("url", "database"),
    [
        ("redis://localhost/3", ("127.0.0.1:6379", 3)),
        ("rediss://:secret@cache.internal:6380/0", ("cache.internal:6380", 0)),
        ("redis://127.0.0.1:6379?db=5", ("127.0.0.1:6379", 5)),
        ("unix:///run/redis.sock?db=2", ("/run/redis.sock", 2)),
        ("redis+socket:///run/redis.sock?virtual_host=4", ("/run/redis.sock", 4)),
        ("redis://localhost/x", None),
        ("amqp://guest@localhost//", None),
    ],
)
def test_redis_urls_compared_by_server_and_database(url: str, database: tuple[str, int] | None) -> None:
    assert celery_checks._redis_database(url) == database


def test_w006_with_a_failover_list_of_brokers(make_app: MakeApp) -> None:
    port = settings.LOCK_REDIS_URL.rsplit(":", 1)[1].split("/")[0]
    make_app(broker_url=[f"redis://127.0.0.1:{port}/12", "redis://standby:6379/12"])
    assert [message.id for message in celery_messages()] == [f"{ID}.W006"]
    make_app(broker_url=f"redis://127.0.0.1:{port}/11;redis://127.0.0.1:{port}/12")
    assert celery_messages() == []


FIND_APP = """
import django; django.setup()
from celery import Celery, _state
from django.core.checks import run_checks
import tests.testapp.tasks
# fixups=[]: Celery's Django fixup would make the first app the default one.
other = Celery("other", set_as_current=False, fixups=[])
other.conf.accept_content = ["pickle"]
if {bound}:
    bound = Celery("bound", set_as_current=False, fixups=[])
    bound.conf.accept_content = ["json", "pickle"]
    bound.finalize()
messages = run_checks(tags=["django_idempotent_tasks"])
print([m.msg.split(" accepts")[0] for m in messages if m.id.endswith("E003")])
print(_state.default_app)
"""


@pytest.mark.parametrize(
    ("bound", "found"),
    [(False, "The Celery app 'other'"), (True, "The Celery app 'bound'")],
)
def test_without_a_current_app_the_checks_find_the_one_holding_idempotent_tasks(
    bound: bool, found: str
) -> None:
    output = subprocess.run(
        [sys.executable, "-c", FIND_APP.format(bound=bound)],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (output.returncode, output.stdout) == (0, f"[{found!r}]\nNone\n"), output.stderr


def check_deploy(database_name: str) -> subprocess.CompletedProcess[str]:
    """``manage.py check --deploy`` of the test settings, with the records in ``database_name``."""
    return subprocess.run(
        [sys.executable, "-m", "django", "check", "--deploy", "--tag", TAG, "--settings", "tests.settings"],
        cwd=ROOT,
        env={**os.environ, "IDEMPOTENT_TESTS_DATABASE_NAME": database_name},
        capture_output=True,
        text=True,
    )


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite creates a missing database file")
def test_e005_the_records_database_does_not_exist() -> None:
    name = f"idem_gone_{uuid.uuid4().hex[:8]}"
    checked = check_deploy(name)
    assert checked.returncode == 1
    assert f"({ID}.E005)" in checked.stderr
    assert name in checked.stderr  # the driver's own message names the database
    assert "migrate --database default" in checked.stderr


@pytest.fixture
def empty_database(django_db_blocker: Any, tmp_path: Any) -> Iterator[str]:
    """A database that exists and holds no table."""
    if connection.vendor == "sqlite":
        yield str(tmp_path / "empty.sqlite3")
        return
    name = f"idem_empty_{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock(), connection._nodb_cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
    yield name
    with django_db_blocker.unblock(), connection._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE {connection.ops.quote_name(name)}")


def test_e005_the_records_table_is_missing(empty_database: str) -> None:
    checked = check_deploy(empty_database)
    assert checked.returncode == 1
    assert f"({ID}.E005)" in checked.stderr
    assert "django_idempotent_tasks_idempotencyrecord" in checked.stderr
