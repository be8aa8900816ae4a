"""Errors that say what to do, raised where the mistake shows: the lock cache, bind=True, migrate."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.test import override_settings

from django_idempotent_tasks import store
from django_idempotent_tasks.exceptions import IdempotencyConfigurationError
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.tasks import IdempotentTask
from tests.testapp import tasks
from tests.testapp.models import Effect

FIX = 'Add a cache with "BACKEND": "django_redis.cache.RedisCache" to CACHES and name it in IDEMPOTENT_TASKS_CACHE.'
BUILTIN_REDIS = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:1"}


def deliver(key: str) -> Any:
    """One eager delivery of a task that writes an Effect row; re-raises what the delivery raised."""
    return tasks.record_effect.apply(args=(1,), kwargs={"idempotency_key": key}).get()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("overrides", "found"),
    [
        (
            {"IDEMPOTENT_TASKS_CACHE": "default"},
            "IDEMPOTENT_TASKS_CACHE is 'default', which is not a django-redis cache "
            "(backend 'django.core.cache.backends.locmem.LocMemCache').",
        ),
        (
            {"IDEMPOTENT_TASKS_CACHE": "builtin", "CACHES": {**settings.CACHES, "builtin": BUILTIN_REDIS}},
            "IDEMPOTENT_TASKS_CACHE is 'builtin', which is Django's built-in RedisCache "
            "('django.core.cache.backends.redis.RedisCache'): the locks need django-redis",
        ),
        (
            {"IDEMPOTENT_TASKS_CACHE": "lokcs"},
            "IDEMPOTENT_TASKS_CACHE is 'lokcs', but CACHES has no such cache.",
        ),
    ],
    ids=["locmem", "django-builtin-redis", "typo"],
)
def test_a_bad_lock_cache_fails_the_first_delivery_naming_the_setting(
    overrides: dict[str, Any], found: str
) -> None:
    with override_settings(**overrides), pytest.raises(ImproperlyConfigured) as caught:
        deliver("bad-lock-cache")
    assert found in str(caught.value)
    assert FIX in str(caught.value)
    assert not Effect.objects.exists()  # the body never ran


@pytest.mark.django_db
def test_a_missing_lock_cache_setting_says_it_is_not_set() -> None:
    # startproject's settings: no IDEMPOTENT_TASKS_CACHE, so "default", Django's LocMem cache.
    with override_settings(IDEMPOTENT_TASKS_CACHE="unset"):
        del settings.IDEMPOTENT_TASKS_CACHE
        with pytest.raises(ImproperlyConfigured) as caught:
            deliver("unset-lock-cache")
    assert str(caught.value) == (
        "IDEMPOTENT_TASKS_CACHE is not set, so the lock cache is 'default', which is not a django-redis "
        f"cache (backend 'django.core.cache.backends.locmem.LocMemCache'). {FIX}"
    )


@pytest.mark.django_db
def test_the_lock_cache_is_checked_again_when_caches_change() -> None:
    assert deliver("checked-once") == deliver("checked-once")
    with (
        override_settings(CACHES={**settings.CACHES, "locks": BUILTIN_REDIS}),
        pytest.raises(ImproperlyConfigured),
    ):
        deliver("checked-again")
    deliver("checked-after")  # the real cache again


def bind(body: Any, **options: Any) -> Any:
    """Bind an idempotent task made from ``body`` to a throwaway app, as @shared_task would."""
    app = Celery("throwaway", set_as_current=False)
    decorate: Any = app.task
    return decorate(base=IdempotentTask, lazy=False, shared=False, name="throwaway.charge", **options)(body)


def test_a_self_parameter_without_bind_is_refused_at_bind() -> None:
    def charge(self: Any, order_id: int) -> int:
        return order_id

    with pytest.raises(IdempotencyConfigurationError) as caught:
        bind(charge)
    assert str(caught.value) == (
        "Idempotent task 'throwaway.charge' takes self as its first parameter but is not bound: Celery "
        "passes the task as the first argument only to a bound task, so self would be the first argument "
        "of the call. Add bind=True: @shared_task(base=IdempotentTask, bind=True)."
    )


def test_a_body_using_self_idempotency_without_bind_is_refused_at_bind() -> None:
    def charge(order_id: int) -> str:
        return str(self.idempotency.subkey("charge"))  # type: ignore[name-defined]  # noqa: F821

    def charge_in_a_lambda(order_id: int) -> Any:
        return (lambda: self.idempotency.step)()  # type: ignore[name-defined]  # noqa: F821

    for body in (charge, charge_in_a_lambda):
        with pytest.raises(IdempotencyConfigurationError, match=r"uses self .*Add bind=True"):
            bind(body)


def test_bound_and_selfless_tasks_bind() -> None:
    def bound(self: Any, order_id: int) -> int:
        return order_id

    def selfless(order_id: int) -> int:
        return order_id

    assert bind(bound, bind=True).name == bind(selfless).name == "throwaway.charge"


@pytest.fixture
def records_table_missing() -> Iterator[None]:
    """The records' table renamed away, as before `migrate`; renamed back afterwards."""
    table = IdempotencyRecord._meta.db_table
    with connections["default"].schema_editor() as editor:
        editor.alter_db_table(IdempotencyRecord, table, f"{table}_away")
    try:
        yield
    finally:
        with connections["default"].schema_editor() as editor:
            editor.alter_db_table(IdempotencyRecord, f"{table}_away", table)


@pytest.mark.django_db(transaction=True)
def test_a_missing_table_says_to_run_migrate(records_table_missing: None) -> None:
    with pytest.raises(ImproperlyConfigured) as caught:
        deliver("before-migrate")
    message = str(caught.value)
    assert message.startswith(
        "The idempotency records' table django_idempotent_tasks_idempotencyrecord does not exist in the "
        "database 'default': run `python manage.py migrate`. The database said: "
    )
    assert not Effect.objects.exists()


@pytest.mark.django_db
def test_other_database_errors_pass_through_the_lookup() -> None:
    with connections["default"].cursor() as cursor, pytest.raises(DatabaseError) as caught:
        cursor.execute("SELECT * FROM no_table_of_ours_here")
    assert store.missing_table_error("default", caught.value) is None
