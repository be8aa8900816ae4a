"""W012 under check --deploy: with outbox tasks, some celery beat schedule entry must run the re-drive."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, _state
from django.conf import settings
from django.core import checks

from django_idempotent_tasks.celery_checks import (
    REDRIVE_TASK,
    check_outbox_database,
    check_redrive_scheduled,
    idempotent_tasks,
)
from django_idempotent_tasks.checks import TAG
from django_idempotent_tasks.tasks import IdempotentTask

pytestmark = pytest.mark.django_db  # with django-celery-beat installed, the check reads its table

ID = "django_idempotent_tasks.W012"


@pytest.fixture
def make_app() -> Iterator[Callable[..., Celery]]:
    """A new, current Celery app configured as a project should, with one idempotent task."""
    previous = _state._tls.current_app  # type: ignore[attr-defined]

    def make(outbox: bool | None, **conf: Any) -> Celery:
        app = Celery("redrive-check")
        app.conf.update(broker_url=settings.CELERY_BROKER_URL, accept_content=["json"], **conf)
        app.set_current()

        @app.task(base=IdempotentTask, name="shop.tasks.charge", outbox=outbox, shared=False)
        def charge(order_id: int) -> None:
            """An outbox task (or not)."""

        app.finalize()  # binds the test app's shared tasks too, some of them outbox tasks
        return app

    yield make
    previous.set_current()


def test_outbox_tasks_without_a_beat_entry_warn_under_deploy_only(make_app: Callable[..., Celery]) -> None:
    make_app(outbox=True)
    [warning] = check_redrive_scheduled()
    assert warning.id == ID
    assert warning.msg.startswith(
        "No celery beat schedule entry runs 'django_idempotent_tasks.redrive_pending_records', and "
    )
    # The first three outbox tasks by name: the suite's own (tests.testapp, tests.chaosapp) count too.
    assert re.search(r", and \d+ task\(s\) use the outbox \([\w.]+, [\w.]+, [\w.]+, …\)", warning.msg)
    assert warning.msg.endswith(
        ": a message the broker lost or a publish that failed leaves its record PENDING and nothing sends it again."
    )
    deploy = [message.id for message in checks.run_checks(tags=[TAG], include_deployment_checks=True)]
    assert ID in deploy
    assert ID not in [message.id for message in checks.run_checks(tags=[TAG])]


def test_a_beat_entry_for_the_redrive_passes(make_app: Callable[..., Celery]) -> None:
    make_app(outbox=True, beat_schedule={"redrive": {"task": REDRIVE_TASK, "schedule": 300}})
    assert check_redrive_scheduled() == []


def test_a_task_without_the_outbox_is_not_named(make_app: Callable[..., Celery]) -> None:
    make_app(outbox=False)
    [warning] = check_redrive_scheduled()
    assert "shop.tasks.charge" not in warning.msg


def test_the_setting_turns_every_task_into_an_outbox_task(
    make_app: Callable[..., Celery], settings: Any
) -> None:
    settings.IDEMPOTENT_TASKS_OUTBOX = True
    app = make_app(outbox=None)
    [warning] = check_redrive_scheduled()
    assert f", and {len(idempotent_tasks(app))} task(s) use the outbox" in warning.msg  # every one


class RecordsElsewhere:
    """Writes the idempotency records to the "replica" alias, everything else to the default."""

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "replica" if model._meta.app_label == "django_idempotent_tasks" else None


@pytest.mark.django_db(databases=["default", "replica"])  # the deploy checks read the records' database
def test_outbox_records_routed_off_the_default_database_warn(
    make_app: Callable[..., Celery], settings: Any
) -> None:
    make_app(outbox=True)
    assert check_outbox_database() == []  # the records on the default database: no warning
    settings.DATABASE_ROUTERS = [f"{__name__}.RecordsElsewhere"]
    [warning] = check_outbox_database()
    assert warning.id == "django_idempotent_tasks.W013"
    assert "write the idempotency records to the database 'replica'" in warning.msg
    assert "whether that transaction commits or rolls back" in warning.msg
    deploy = [message.id for message in checks.run_checks(tags=[TAG], include_deployment_checks=True)]
    assert "django_idempotent_tasks.W013" in deploy
