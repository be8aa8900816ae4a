"""Prometheus counters for the deliveries' signals: ``pip install django-idempotent-tasks[metrics]``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from django_idempotent_tasks import signals

PREFIX = "idempotent_tasks"


@dataclass(frozen=True)
class Metrics:
    """The counters, each labelled with the task name."""

    deliveries: Counter
    replays: Counter
    conflicts: Counter
    lost_leases: Counter
    takeovers: Counter
    unstorable_results: Counter
    exhausted: Counter
    unreachable: Counter

    def on_replayed(self, sender: Any, **kwargs: Any) -> None:
        self.replays.labels(task=sender.name).inc()
        self.deliveries.labels(task=sender.name, outcome="replayed").inc()

    def on_completed(self, sender: Any, **kwargs: Any) -> None:
        self.deliveries.labels(task=sender.name, outcome="completed").inc()

    def on_failed(self, sender: Any, **kwargs: Any) -> None:
        self.deliveries.labels(task=sender.name, outcome="failed").inc()

    def on_conflict(self, sender: Any, action: str, **kwargs: Any) -> None:
        self.conflicts.labels(task=sender.name, action=action).inc()
        if action != "wait":  # a waiting delivery goes on, and ends in one of the other outcomes
            self.deliveries.labels(task=sender.name, outcome="conflict").inc()

    def on_lease_lost(self, sender: Any, **kwargs: Any) -> None:
        self.lost_leases.labels(task=sender.name).inc()

    def on_claimed(self, sender: Any, recovered: bool, **kwargs: Any) -> None:
        if recovered:  # an earlier attempt died mid-body and this one took over its lease
            self.takeovers.labels(task=sender.name).inc()

    def on_unstorable(self, sender: Any, **kwargs: Any) -> None:
        self.unstorable_results.labels(task=sender.name).inc()

    def on_exhausted(self, sender: Any, **kwargs: Any) -> None:
        self.exhausted.labels(task=sender.name).inc()
        self.deliveries.labels(task=sender.name, outcome="exhausted").inc()

    def on_unreachable(self, sender: Any, alias: str, **kwargs: Any) -> None:
        self.unreachable.labels(task=sender.name, database=alias).inc()


# A registry refuses a second counter of one name. Each entry keeps its registry alive, so the
# id() keys (here and in dispatch_uid) never come back for another registry.
_created: dict[int, tuple[CollectorRegistry, Metrics]] = {}
_connected: set[int] = set()
SIGNALS = (
    signals.task_replayed,
    signals.lock_conflict,
    signals.lease_lost,
    signals.task_claimed,
    signals.result_unstorable,
    signals.attempts_exhausted,
    signals.database_unreachable,
    signals.task_completed,
    signals.task_failed,
)


def _counters(registry: CollectorRegistry) -> Metrics:
    def counter(name: str, documentation: str, *labels: str) -> Counter:
        return Counter(f"{PREFIX}_{name}", documentation, ["task", *labels], registry=registry)

    return Metrics(
        deliveries=counter(
            "deliveries",
            "Deliveries by how they ended: replayed, completed, failed, conflict or exhausted.",
            "outcome",
        ),
        replays=counter("replays", "Deliveries answered from the stored result."),
        conflicts=counter("conflicts", "Deliveries that found the key held by another.", "action"),
        lost_leases=counter("lost_leases", "Holders whose lease was taken over."),
        takeovers=counter("takeovers", "Claims that took over the lease of a delivery that died."),
        unstorable_results=counter("unstorable_results", "Results that could not be stored."),
        exhausted=counter("attempts_exhausted", "Keys failed for good after max_attempts."),
        unreachable=counter(
            "database_unreachable",
            "ERRORs logged because the records' database stayed unreachable for over a lease.",
            "database",
        ),
    )


def connect(registry: CollectorRegistry = REGISTRY) -> Metrics:
    """Create the counters in ``registry`` (once) and count the signals into them; idempotent."""
    if id(registry) not in _created:
        _created[id(registry)] = (registry, _counters(registry))
    metrics = _created[id(registry)][1]
    if id(registry) not in _connected:
        receivers: tuple[Callable[..., None], ...] = (
            metrics.on_replayed,
            metrics.on_conflict,
            metrics.on_lease_lost,
            metrics.on_claimed,
            metrics.on_unstorable,
            metrics.on_exhausted,
            metrics.on_unreachable,
            metrics.on_completed,
            metrics.on_failed,
        )
        for signal, receiver in zip(SIGNALS, receivers, strict=True):
            signal.connect(receiver, weak=False, dispatch_uid=_uid(registry))
        _connected.add(id(registry))
    return metrics


def disconnect(registry: CollectorRegistry = REGISTRY) -> None:
    """Stop counting into ``registry``; its counters stay registered and keep their values."""
    for signal in SIGNALS:
        signal.disconnect(dispatch_uid=_uid(registry))
    _connected.discard(id(registry))


def _uid(registry: CollectorRegistry) -> str:
    return f"{PREFIX}.prometheus.{id(registry)}"
