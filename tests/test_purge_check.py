"""W009 under check --deploy: some celery beat schedule entry must run purge_expired_records."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, _state
from django.apps import apps
from django.conf import settings
from django.core import checks

from django_idempotent_tasks.celery_checks import PURGE_TASK, check_purge_scheduled
from django_idempotent_tasks.checks import TAG

# With django-celery-beat installed, the check reads its PeriodicTask table.
pytestmark = pytest.mark.django_db

ID = "django_idempotent_tasks.W009"
EXPECTED = checks.Warning(
    "No celery beat schedule entry runs 'django_idempotent_tasks.purge_expired_records': expired "
    "idempotency records are never deleted and the table grows without bound.",
    hint="Add an entry with \"task\": 'django_idempotent_tasks.purge_expired_records' to beat_schedule "
    "(CELERY_BEAT_SCHEDULE), or a periodic task in django-celery-beat, or run purge_idempotency_records "
    f"from cron and silence {ID}.",
    id=ID,
)


@pytest.fixture
def make_app() -> Iterator[Callable[..., Celery]]:
    """A new, current Celery app configured as a project should, plus ``conf``."""
    previous = _state._tls.current_app  # type: ignore[attr-defined]

    def make(**conf: Any) -> Celery:
        app = Celery("purge-check")
        app.conf.update(
            broker_url=settings.CELERY_BROKER_URL,
            accept_content=["json"],
            task_acks_late=True,
            task_reject_on_worker_lost=True,
            broker_transport_options={"visibility_timeout": 3600},
            **conf,
        )
        app.set_current()
        return app

    yield make
    previous.set_current()


def test_no_beat_entry_warns_under_deploy_only(make_app: Callable[..., Celery]) -> None:
    make_app()
    assert check_purge_scheduled() == [EXPECTED]
    deploy = [message.id for message in checks.run_checks(tags=[TAG], include_deployment_checks=True)]
    assert ID in deploy
    assert ID not in [message.id for message in checks.run_checks(tags=[TAG])]


def test_a_beat_entry_for_the_purge_passes(make_app: Callable[..., Celery]) -> None:
    make_app(beat_schedule={"purge": {"task": PURGE_TASK, "schedule": 3600}})
    assert check_purge_scheduled() == []


def test_a_beat_schedule_without_the_purge_warns(make_app: Callable[..., Celery]) -> None:
    make_app(beat_schedule={"report": {"task": "shop.tasks.report", "schedule": 60}})
    assert check_purge_scheduled() == [EXPECTED]


beat_database = pytest.mark.skipif(
    not apps.is_installed("django_celery_beat"),
    reason="django-celery-beat is not installed: it does not support Django 6.1 yet (tox.ini)",
)


def periodic_task(task: str, enabled: bool = True) -> None:
    """A row of django-celery-beat's DatabaseScheduler, as its admin makes one."""
    interval = apps.get_model("django_celery_beat", "IntervalSchedule")._default_manager.create(
        every=1, period="hours"
    )
    apps.get_model("django_celery_beat", "PeriodicTask")._default_manager.create(
        name=f"run {task}", task=task, interval=interval, enabled=enabled
    )


@beat_database
def test_an_enabled_periodic_task_of_the_database_scheduler_passes(make_app: Callable[..., Celery]) -> None:
    make_app(beat_scheduler="django_celery_beat.schedulers:DatabaseScheduler")
    periodic_task(PURGE_TASK)
    assert check_purge_scheduled() == []


@beat_database
@pytest.mark.parametrize(("task", "enabled"), [(PURGE_TASK, False), ("shop.tasks.report", True)])
def test_a_disabled_or_other_periodic_task_warns(
    make_app: Callable[..., Celery], task: str, enabled: bool
) -> None:
    make_app(beat_scheduler="django_celery_beat.schedulers:DatabaseScheduler")
    periodic_task(task, enabled=enabled)
    assert check_purge_scheduled() == [EXPECTED]
