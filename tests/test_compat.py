"""Each private Celery or Django API behind django_idempotent_tasks.compat still does what we rely on.

A failure here after upgrading Celery or Django names the one function of compat.py to revisit.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from celery import Celery, chain
from celery import current_app as celery_current_app
from celery import current_task as celery_current_task
from celery.app.registry import TaskRegistry
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_idempotent_tasks import compat
from django_idempotent_tasks.models import IdempotencyRecord
from tests import settings as test_settings
from tests.celery_app import app as celery_app
from tests.testapp import tasks

KEY = "idempotency_key"


def _value(value: int) -> int:
    return value


def test_push_task_makes_it_celerys_current_task() -> None:
    current_task: Any = celery_current_task
    compat.push_task(tasks.record_effect)
    try:
        assert current_task._get_current_object() is tasks.record_effect
    finally:
        compat.pop_task()
    assert current_task._get_current_object() is not tasks.record_effect


def test_push_request_keeping_keeps_the_workers_request_and_applies_the_changes() -> None:
    task = tasks.record_effect
    task.push_request(id="the-worker-id", retries=2, delivery_info={"routing_key": "celery"})
    try:
        compat.push_request_keeping(task, args=(7,), kwargs={KEY: "k"})
        try:
            request = task.request
            assert (request.id, request.retries, request.delivery_info) == (
                "the-worker-id",
                2,
                {"routing_key": "celery"},
            )
            assert (request.args, request.kwargs) == ((7,), {KEY: "k"})
        finally:
            task.pop_request()
        assert task.request.args is None
    finally:
        task.pop_request()


def test_let_argument_through_rewraps_the_argument_check_of_a_function_task() -> None:
    app = Celery("compat", set_as_current=False)
    task: Any = app.task(shared=False, lazy=False, name="compat.value")(_value)
    task_class = type(task)
    assert "__header__" in task_class.__dict__  # Task.typing checks arguments through it
    with pytest.raises(TypeError):
        task_class.__header__(1, **{KEY: "k"})
    compat.let_argument_through(task_class, KEY)
    task_class.__header__(1, **{KEY: "k"})  # let through
    with pytest.raises(TypeError):
        task_class.__header__(1, other="x")  # every other argument is still checked
    with pytest.raises(TypeError):
        task_class.__header__()


def test_let_argument_through_leaves_a_class_without_a_header_alone() -> None:
    class Plain:
        pass

    compat.let_argument_through(Plain, KEY)
    assert "__header__" not in Plain.__dict__


def test_current_app_is_celerys_current_app_and_never_creates_one() -> None:
    current_app: Any = celery_current_app
    assert compat.current_app() is current_app._get_current_object()


def test_active_apps_lists_every_live_app() -> None:
    app = Celery("compat-active", set_as_current=False)
    assert app in compat.active_apps()
    assert celery_app in compat.active_apps()


def test_registered_tasks_finalizes_only_what_celery_would() -> None:
    assert compat.registered_tasks(celery_app) is celery_app.tasks
    automatic: Any = Celery("compat-automatic", set_as_current=False)
    task: Any = automatic.task(shared=False, lazy=False, name="compat.automatic")(_value)
    assert compat.registered_tasks(automatic)["compat.automatic"] is task
    assert automatic.finalized
    manual: Any = Celery("compat-manual", set_as_current=False, autofinalize=False)
    assert isinstance(compat.registered_tasks(manual), TaskRegistry)
    assert not manual.finalized


@pytest.mark.django_db
def test_raw_delete_deletes_the_rows_of_the_queryset_in_one_statement(
    django_assert_num_queries: Any,
) -> None:
    later = timezone.now() + timedelta(days=1)
    for key in ("a", "b"):
        IdempotencyRecord.objects.create(
            scope="compat", key=key, task_name="compat", fingerprint="f", expires_at=later
        )
    with django_assert_num_queries(1):
        assert compat.raw_delete(IdempotencyRecord.objects.filter(key="a")) == 1
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["b"]


@pytest.mark.django_db
def test_changelist_params_are_the_query_the_admin_changelist_was_built_from(admin_client: Client) -> None:
    url = reverse("admin:django_idempotent_tasks_idempotencyrecord_changelist")
    response = admin_client.get(url, {"expired": "yes"})
    assert response.status_code == 200
    assert compat.changelist_params(response.context["cl"])["expired"] == "yes"


def test_is_unfiltered_tells_the_whole_table_from_a_filtered_or_distinct_queryset() -> None:
    records = IdempotencyRecord.objects.all()
    assert compat.is_unfiltered(records)
    assert not compat.is_unfiltered(records.filter(key="a"))
    assert not compat.is_unfiltered(records.distinct())
    assert not compat.is_unfiltered([])


def test_chain_is_the_class_of_a_chain_signature() -> None:
    first, second = tasks.record_effect.s(1), tasks.record_effect.s(2)
    assert isinstance(chain(first, second), compat.CHAIN)
    assert isinstance(first | second, compat.CHAIN)
    assert not isinstance(first, compat.CHAIN)


@pytest.mark.django_db
def test_psycopg_binds_where_the_run_asks() -> None:
    # make test-server-binding runs the suite with Django's server_side_binding: its statements
    # must then really go out with server-side parameters (psycopg's ClientCursor is the default).
    if connection.vendor != "postgresql":
        pytest.skip("server_side_binding is an option of Django's PostgreSQL backend")
    with connection.cursor() as cursor:
        client_side = isinstance(cursor.cursor, psycopg.ClientCursor)
    assert client_side is not test_settings.SERVER_SIDE_BINDING
