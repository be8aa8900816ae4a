"""Faults a body or a template brings with it: an exception whose str() fails, a template reading an
attribute of a JSON argument. Each leaves a clear record or a clear error, never a stuck key.

Runs on whichever database DATABASE_URL names: PostgreSQL, MariaDB or SQLite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery, shared_task
from django.conf import settings

from django_idempotent_tasks.decorators import idempotent
from django_idempotent_tasks.exceptions import IdempotencyConfigurationError, MissingIdempotencyKey
from django_idempotent_tasks.models import IdempotencyRecord
from django_idempotent_tasks.tasks import IdempotentTask
from django_idempotent_tasks.testing import assert_runs_once
from tests.celery_app import app as celery_app
from tests.running import run_task

# No worker consumes this queue: what delay() sent stays there to be counted.
QUEUE = "worker-faults-tests"


class DetailError(Exception):
    """An API client's error: its ``__str__`` returns its detail, a dict, so str() raises TypeError."""

    def __init__(self, detail: Any) -> None:
        super().__init__(detail)
        self.detail = detail

    def __str__(self) -> str:
        return self.detail  # type: ignore[no-any-return]


class UnprintableError(Exception):
    """An error neither str() nor repr() can render."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@shared_task(base=IdempotentTask, bind=True, name="tests.worker_faults.raises_detail")
def raises_detail(self: Any, code: int) -> None:
    raise DetailError({"code": code})


@shared_task(base=IdempotentTask, bind=True, name="tests.worker_faults.raises_unprintable")
def raises_unprintable(self: Any) -> None:
    raise UnprintableError()


@idempotent
def detail_function(code: int) -> None:
    raise DetailError({"code": code})


def failed_record(key: str) -> dict[str, str]:
    record = IdempotencyRecord.objects.get(key=key)
    assert record.status == "FAILED" and record.error is not None
    return dict(record.error)


@pytest.mark.django_db(transaction=True)
def test_an_error_whose_str_fails_fails_the_key_and_reaches_the_caller() -> None:
    with pytest.raises(DetailError):
        run_task(raises_detail, 7, key="str-fails")
    error = failed_record("str-fails")
    assert error["type"] == "DetailError"
    assert error["message"] == "DetailError (its str() failed): DetailError({'code': 7})"
    with pytest.raises(DetailError):  # FAILED, not stuck IN_PROGRESS: the next delivery runs it again
        run_task(raises_detail, 7, key="str-fails")


@pytest.mark.django_db(transaction=True)
def test_an_error_whose_str_and_repr_fail_fails_the_key_and_reaches_the_caller() -> None:
    with pytest.raises(UnprintableError):
        run_task(raises_unprintable, key="repr-fails")
    assert failed_record("repr-fails")["message"] == "UnprintableError (its str() and repr() failed)"


@pytest.mark.django_db(transaction=True)
def test_a_function_whose_error_str_fails_fails_the_key_and_raises_it() -> None:
    with pytest.raises(DetailError):
        detail_function(3, idempotency_key="function-str-fails")
    assert failed_record("function-str-fails")["type"] == "DetailError"


@pytest.mark.django_db(transaction=True)
def test_assert_runs_once_reports_an_error_whose_repr_fails() -> None:
    with pytest.raises(AssertionError, match=r"raised: \[UnprintableError \(its repr\(\) failed\)\]"):
        assert_runs_once(raises_unprintable, key="helper-repr-fails", times=1, threads=False)


@shared_task(
    base=IdempotentTask,
    bind=True,
    name="tests.worker_faults.order_attribute",
    idempotency_key="order-{order.id}",
)
def order_attribute(self: Any, order: dict[str, Any]) -> None:
    """A template reading an attribute of an argument that arrives as a JSON object."""


@shared_task(
    base=IdempotentTask,
    bind=True,
    name="tests.worker_faults.bad_format_spec",
    idempotency_key="order-{order_id:q}",
)
def bad_format_spec(self: Any, order_id: int) -> None:
    """A template whose format spec does not apply to the argument."""


@idempotent(key="order-{order.id}")
def order_attribute_function(order: dict[str, Any]) -> None:
    """The function form of ``order_attribute``."""


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    default = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = QUEUE
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete(QUEUE)
    try:
        yield broker
    finally:
        celery_app.conf.task_default_queue = default
        broker.delete(QUEUE)


@pytest.mark.parametrize(
    ("task", "template", "problem"),
    [
        (order_attribute, "order-{order.id}", "AttributeError(\"'dict' object has no attribute 'id'\")"),
        (
            bad_format_spec,
            "order-{order_id:q}",
            "ValueError(\"Unknown format code 'q' for object of type 'int'\")",
        ),
    ],
)
def test_a_template_that_cannot_render_names_the_task_and_sends_nothing(
    broker: redis.Redis, task: Any, template: str, problem: str
) -> None:
    with pytest.raises(MissingIdempotencyKey) as caught:
        task.delay({"id": 5} if task is order_attribute else 5)
    assert str(caught.value) == (
        f"Task {task.name!r} could not derive its idempotency key from the template {template!r}: "
        f"{problem}. Pass idempotency_key=... or fix the template."
    )
    assert broker.llen(QUEUE) == 0


@pytest.mark.django_db(transaction=True)
def test_a_function_template_that_cannot_render_names_it_and_runs_nothing() -> None:
    with pytest.raises(
        MissingIdempotencyKey, match=r"order_attribute_function.*'order-\{order.id\}'.*AttributeError"
    ):
        order_attribute_function({"id": 5})
    assert not IdempotencyRecord.objects.exists()


def unbound_task(name: str) -> Callable[[Callable[..., Any]], Any]:
    """A decorator making an idempotent task without bind=True, on a throwaway Celery app.

    Not @shared_task nor the test app: a task refused at bind would stay in that app's registry,
    and a shared one would be built again in every Celery app a later test creates.
    """
    decorate: Any = Celery("worker-faults", set_as_current=False).task
    made: Callable[[Callable[..., Any]], Any] = decorate(
        base=IdempotentTask, lazy=False, shared=False, name=f"tests.worker_faults.{name}"
    )
    return made


@pytest.mark.django_db(transaction=True)
def test_an_unbound_task_reading_an_attribute_named_self_binds_and_runs() -> None:
    # Defined here, not at import, so that a refusal at bind fails this test alone.
    @unbound_task("reads_attribute_self")
    def reads_attribute_self(value: str) -> Any:
        link = SimpleNamespace(self=value)  # jira's issue.self, JSON:API's links.self
        return link.self, (lambda: link.self)()

    assert run_task(reads_attribute_self, "x", key="attribute-self") == ["x", "x"]
    assert IdempotencyRecord.objects.get(key="attribute-self").status == "SUCCEEDED"


def test_an_unbound_task_reading_a_global_self_is_still_refused() -> None:
    with pytest.raises(IdempotencyConfigurationError, match=r"'tests.worker_faults.global_self' uses self"):

        @unbound_task("global_self")
        def global_self(value: str) -> Any:
            return SimpleNamespace(self=value).self, self.idempotency.key  # type: ignore[name-defined]  # noqa: F821


# Numbers PostgreSQL's jsonb reads back otherwise than Python wrote them (a numeric, no exponent, no
# negative zero). MariaDB and SQLite keep the JSON text as written.
NUMBERS = {
    "1e16": 1e16,
    "2.5e300": 2.5e300,
    "negative zero": -0.0,
    "1e-7": 1e-7,
    "nested": {"b": [1e20, 1.5]},
}


@shared_task(base=IdempotentTask, bind=True, name="tests.worker_faults.returns_number")
def returns_number(self: Any, name: str) -> Any:
    return NUMBERS[name]


STEP_VALUES: list[str] = []  # what the body's step returned, attempt by attempt


@shared_task(base=IdempotentTask, bind=True, name="tests.worker_faults.stepped_number")
def stepped_number(self: Any, name: str) -> Any:
    value = self.idempotency.step("measure", lambda: NUMBERS[name])
    STEP_VALUES.append(repr(value))
    if self.idempotency.attempt == 1:
        raise RuntimeError("after the step")
    return value


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", list(NUMBERS))
def test_a_first_execution_returns_what_its_replays_return(name: str) -> None:
    # A workflow feeds a result into its next call: a first run that returned 1e16 and a replay
    # that returns 10000000000000000 fingerprint that call differently (IdempotencyKeyMismatch).
    first = run_task(returns_number, name, key=f"number-{name}")
    again = run_task(returns_number, name, key=f"number-{name}")
    assert repr(first) == repr(again)


@pytest.mark.django_db(transaction=True)
def test_a_step_reads_back_what_it_returned_the_first_time() -> None:
    STEP_VALUES.clear()
    with pytest.raises(RuntimeError, match="after the step"):
        run_task(stepped_number, "1e16", key="stepped-number")
    run_task(stepped_number, "1e16", key="stepped-number")  # the step's checkpoint, read back
    assert len(STEP_VALUES) == 2 and STEP_VALUES[0] == STEP_VALUES[1]
