"""Helpers for your own test suites: count body executions, and prove a task runs once per key.

Each takes an idempotent Celery task, an ``@idempotent`` function or a ``django.tasks`` task."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connections

from django_idempotent_tasks import signals, spec, values
from django_idempotent_tasks.exceptions import TaskInProgress

__all__ = ["Execution", "Executions", "assert_runs_once", "count_executions"]

KEY_ARGUMENT = "idempotency_key"


@dataclass(frozen=True)
class Execution:
    """One start of a task's body: the key it ran under and the claim it held."""

    key: str
    scope: str
    fence: int
    attempt: int
    recovered: bool


class Executions:
    """The body executions of one task seen in this process while counting."""

    def __init__(self, task_name: str) -> None:
        self.task_name = task_name
        self._lock = threading.Lock()
        self._runs: list[Execution] = []

    def add(self, execution: Execution) -> None:
        """Record one execution (called from any thread)."""
        with self._lock:
            self._runs.append(execution)

    @property
    def runs(self) -> list[Execution]:
        """Every execution so far, in order."""
        with self._lock:
            return list(self._runs)

    @property
    def count(self) -> int:
        """How many times the body started."""
        return len(self.runs)

    def for_key(self, key: str) -> list[Execution]:
        """The executions under one idempotency key."""
        return [run for run in self.runs if run.key == key]

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"<Executions of {self.task_name}: {self.count}>"


def _task_name(task: Any) -> str:
    """The name a task's deliveries send their signals under (a function's: its dotted path)."""
    found = spec.of(task)
    name = found.name if found is not None else getattr(task, "name", None)
    if not isinstance(name, str):
        raise TypeError(
            f"Expected a Celery task, an @idempotent function or a django.tasks task, got {task!r}."
        )
    return name


@contextmanager
def count_executions(task: Any) -> Iterator[Executions]:
    """Count the body executions of ``task`` in this process (any thread) inside the block.

    A body starts right after its delivery claims the key (the ``task_claimed`` signal); replays and
    conflicts do not count. Bodies run by other processes (a real worker) are not seen.
    """
    executions = Executions(_task_name(task))

    def on_claimed(
        sender: Any, key: str, scope: str, fence: int, attempt: int, recovered: bool, **_: Any
    ) -> None:
        # shared_task hands out proxies, so match the task by name rather than by sender identity.
        if getattr(sender, "name", None) == executions.task_name:
            executions.add(Execution(key, scope, fence, attempt, recovered))

    signals.task_claimed.connect(on_claimed, weak=False, dispatch_uid=id(executions))
    try:
        yield executions
    finally:
        signals.task_claimed.disconnect(dispatch_uid=id(executions))


def _in_transaction() -> bool:
    return any(connection.in_atomic_block for connection in connections.all(initialized_only=True))


def _apply(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """Run one delivery in this process; returns (True, result) or (False, the exception it raised)."""
    try:
        if hasattr(task, "apply"):  # a Celery task: an eager delivery
            return True, task.apply(args=args, kwargs=kwargs).get()
        # A django.tasks task runs its idempotent function, as a worker of its backend would.
        return True, getattr(task, "func", task)(*args, **kwargs)
    except Exception as exc:
        return False, exc


def assert_runs_once(
    task: Any,
    *args: Any,
    key: str,
    times: int = 10,
    threads: bool = True,
    timeout: float = 120,
    **kwargs: Any,
) -> list[Any]:
    """Deliver ``task(*args, **kwargs)`` ``times`` times under ``key`` and assert its body ran once.

    With ``threads=True`` the deliveries start together in real threads, each with its own database
    connection, so the data they read must be committed (``TransactionTestCase`` or
    ``@pytest.mark.django_db(transaction=True)``). Every delivery must return the same result,
    except that a task with ``on_conflict="raise"`` may answer ``TaskInProgress``. Returns the results.
    """
    if times < 1:
        raise ValueError(f"times must be at least 1, got {times}.")
    name, found = _task_name(task), spec.of(task)
    on_conflict = found.options.on_conflict if found is not None else getattr(task, "on_conflict", None)
    if threads and _in_transaction():
        raise RuntimeError(
            "assert_runs_once(threads=True) runs deliveries on other database connections, which cannot "
            "see this test's uncommitted transaction. Use TransactionTestCase or "
            "@pytest.mark.django_db(transaction=True), or pass threads=False."
        )
    call_kwargs = {**kwargs, KEY_ARGUMENT: key}
    outcomes: list[tuple[bool, Any]] = []
    with count_executions(task) as executions:
        if threads:
            outcomes = _run_in_threads(task, name, args, call_kwargs, times, timeout)
        else:
            outcomes = [_apply(task, args, call_kwargs) for _ in range(times)]
    allowed: tuple[type[BaseException], ...] = (TaskInProgress,) if on_conflict == "raise" else ()
    _check(name, allowed, key, times, executions.for_key(key), outcomes)
    return [value for ok, value in outcomes if ok]


def _run_in_threads(
    task: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], times: int, timeout: float
) -> list[tuple[bool, Any]]:
    outcomes: list[tuple[bool, Any] | None] = [None] * times
    start = threading.Barrier(times)

    def deliver(index: int) -> None:
        try:
            start.wait(timeout)
            outcomes[index] = _apply(task, args, kwargs)
        finally:
            # Each thread opened its own connections; leaving them open blocks dropping the test database.
            connections.close_all()

    workers = [
        threading.Thread(target=deliver, args=(n,), name=f"assert-runs-once-{n}") for n in range(times)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout)
    if any(worker.is_alive() for worker in workers):
        raise AssertionError(f"{times} deliveries of {name} did not all finish within {timeout} s.")
    return [outcome for outcome in outcomes if outcome is not None]


def _check(
    name: str,
    allowed: tuple[type[BaseException], ...],
    key: str,
    times: int,
    runs: list[Execution],
    outcomes: list[tuple[bool, Any]],
) -> None:
    errors = [value for ok, value in outcomes if not ok and not isinstance(value, allowed)]
    listed = f"[{', '.join(map(values.error_repr, errors))}]"  # a body's error may not repr()
    if len(runs) != 1:
        hint = " Was the key used before this call?" if not runs and not errors else ""
        raise AssertionError(
            f"The body of {name} ran {len(runs)} times under key {key!r} in {times} deliveries, "
            f"expected once.{hint} Errors: {listed}"
        ) from (errors[0] if errors else None)
    if errors:
        raise AssertionError(
            f"{len(errors)} of {times} deliveries of {name} under key {key!r} raised: {listed}"
        ) from errors[0]
    results = [value for ok, value in outcomes if ok]
    if any(result != results[0] for result in results):
        raise AssertionError(
            f"Deliveries of {name} under key {key!r} returned different results: {results!r}"
        )
