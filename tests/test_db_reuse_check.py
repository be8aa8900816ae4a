"""W010 under check --deploy: without CELERY_DB_REUSE_MAX every task reconnects to the database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, _state
from django.conf import settings
from django.core import checks

from django_idempotent_tasks.celery_checks import check_db_reuse
from django_idempotent_tasks.checks import TAG

ID = "django_idempotent_tasks.W010"

# The deploy checks run W009 too, which reads django-celery-beat's schedule table when it is installed.
pytestmark = pytest.mark.django_db


@pytest.fixture
def make_app() -> Iterator[Callable[..., Celery]]:
    """A new, current Celery app configured as a project should, plus ``conf``."""
    previous = _state._tls.current_app  # type: ignore[attr-defined]

    def make(**conf: Any) -> Celery:
        app = Celery("db-reuse-check")
        app.conf.update(broker_url=settings.CELERY_BROKER_URL, accept_content=["json"], **conf)
        app.set_current()
        return app

    yield make
    previous.set_current()


def test_an_app_without_db_reuse_warns_under_deploy_only(make_app: Callable[..., Celery]) -> None:
    make_app()
    [warning] = check_db_reuse()
    assert warning.id == ID and isinstance(warning, checks.Warning)
    assert "CELERY_DB_REUSE_MAX is not set" in warning.msg
    assert "CELERY_DB_REUSE_MAX = 1000" in (warning.hint or "")
    deploy = [message.id for message in checks.run_checks(tags=[TAG], include_deployment_checks=True)]
    assert ID in deploy
    assert ID not in [message.id for message in checks.run_checks(tags=[TAG])]


def test_an_app_reusing_connections_passes(make_app: Callable[..., Celery]) -> None:
    make_app(CELERY_DB_REUSE_MAX=1000)
    assert check_db_reuse() == []


def test_the_test_settings_app_reads_the_django_setting() -> None:
    # tests/celery_app.py reads the Django settings (namespace CELERY), where the setting is 1000.
    assert settings.CELERY_DB_REUSE_MAX == 1000
    assert check_db_reuse() == []
