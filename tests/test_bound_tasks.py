"""The registry of bound idempotent tasks (filled in on_bound) that the checks and the canvas read."""

from __future__ import annotations

import gc
from typing import Any

from celery import Celery

from django_idempotent_tasks import celery_checks, options
from django_idempotent_tasks.tasks import IdempotentTask, purge_expired_records
from tests.celery_app import app as celery_app
from tests.testapp import tasks


def _value(self: Any, value: int) -> int:
    return value


def _make_app(name: str) -> Any:
    app: Any = Celery(name, set_as_current=False)
    app.task(base=IdempotentTask, bind=True, shared=False, lazy=False, name=f"{name}.one")(_value)
    app.task(base=IdempotentTask, bind=True, shared=False, lazy=False, name=f"{name}.two")(_value)
    app.task(bind=True, shared=False, lazy=False, name=f"{name}.plain")(_value)
    return app


def test_binding_registers_the_idempotent_tasks_of_an_app_and_only_them() -> None:
    app = _make_app("registry")
    own = ["registry.one", "registry.two"]
    assert [name for name in options.bound_tasks(app) if name.startswith("registry.")] == own
    app.finalize()
    assert tasks.record_effect.name in options.bound_tasks(app)  # shared tasks bind at finalize
    found = celery_checks.idempotent_tasks(app)
    assert [task.name for task in found] == options.bound_tasks(app)
    assert all(task is app.tasks[task.name] for task in found)
    assert app in options.apps_with_bound_tasks()


def test_is_idempotent_tells_a_bound_idempotent_task_from_any_other() -> None:
    assert options.is_idempotent(celery_app.tasks[tasks.record_effect.name])
    assert not options.is_idempotent(celery_app.tasks[purge_expired_records.name])
    assert not options.is_idempotent(None)


def test_an_app_that_is_gone_leaves_the_registry() -> None:
    app = _make_app("gone")
    assert app in options.apps_with_bound_tasks()
    del app
    gc.collect()
    assert not any(app.main == "gone" for app in options.apps_with_bound_tasks())
