"""Invariants I1–I6 over what a chaos run left behind, and the table that reports them."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections
from django.db.models import Count

from django_idempotent_tasks.models import IdempotencyRecord
from tests.chaosapp.models import ChaosEffect

Status = IdempotencyRecord.Status
# Seconds before a PostgreSQL restart in which a body's external call counts as cut off by it.
RESTART_REACH = 10
ATOMIC_TASKS = ("chaos.effect", "chaos.slow", "chaos.poison", "chaos.outbox")
OUTBOX_TASKS = ("chaos.outbox", "chaos.outbox_external")


@dataclass
class Observed:
    """Everything the checker reads: records, effects, ledger, answers and the faults' notes."""

    keys: set[str]
    poison: set[str]
    messages: list[tuple[str, str]]
    records: dict[str, IdempotencyRecord] = field(default_factory=dict)
    effects: Counter[str] = field(default_factory=Counter)
    ledger: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    received: set[str] = field(default_factory=set)
    # Messages one of whose copies (a re-queue) was handed to the broker and never reached a worker.
    copy_lost: set[str] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)
    bodies: int = 0
    # Outbox tasks: sends answered at the caller (replayed with their value, or attached to the
    # message on its way), messages the broker dropped, and messages the re-drive sent again.
    replayed: list[tuple[str, Any]] = field(default_factory=list)
    attached: int = 0
    dropped: list[str] = field(default_factory=list)
    redriven: int = 0


def text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def read_answers(task_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The final state each message left in the result backend (none while it is requeued)."""
    client = redis.Redis.from_url(settings.CELERY_RESULT_BACKEND)
    answers = {}
    for start in range(0, len(task_ids), 500):
        chunk = task_ids[start : start + 500]
        for task_id, raw in zip(chunk, client.mget([f"celery-task-meta-{t}" for t in chunk]), strict=True):
            if raw is not None:
                answers[task_id] = json.loads(raw)
    return answers


def settled(observed: Observed) -> bool:
    """Every key final and every message answered: the run is over."""
    try:
        return _settled(observed)
    except (OperationalError, InterfaceError):
        connections.close_all()  # the soak restarted PostgreSQL under this connection
        return False


def _settled(observed: Observed) -> bool:
    records = IdempotencyRecord.objects.filter(key__in=observed.keys)
    final = records.filter(status__in=[Status.SUCCEEDED, Status.FAILED]).count()
    if final < len(observed.keys):
        return False
    answers = read_answers([task_id for task_id, _ in observed.messages])
    return len(answers) == len(observed.messages)


def unsettled(observed: Observed, control: redis.Redis) -> list[str]:
    """The keys without a final record now (a key no worker ever received is the broker's loss)."""
    received = {text(raw) for raw in control.hkeys("receptions")}
    delivered = {key for task_id, key in observed.messages if task_id in received}
    try:
        final = set(
            IdempotencyRecord.objects.filter(
                key__in=observed.keys, status__in=[Status.SUCCEEDED, Status.FAILED]
            ).values_list("key", flat=True)
        )
    except (OperationalError, InterfaceError):
        connections.close_all()
        return sorted(observed.keys)
    return sorted(delivered - final)


def observe(observed: Observed, control: redis.Redis) -> Observed:
    for record in IdempotencyRecord.objects.filter(key__in=observed.keys):
        observed.records[record.key] = record
    rows = ChaosEffect.objects.values("key").annotate(n=Count("id"))
    observed.effects = Counter({row["key"]: row["n"] for row in rows})
    for key in observed.keys:
        entries = [text(raw).split() for raw in control.lrange(f"ext:{key}", 0, -1)]
        observed.ledger[key] = [(int(pid), int(fence), float(at)) for pid, fence, _, at in entries]
    observed.answers = read_answers([task_id for task_id, _ in observed.messages])
    receptions = {text(k): int(v) for k, v in control.hgetall("receptions").items()}
    observed.received = set(receptions)
    publications = {text(k): int(v) for k, v in control.hgetall("publications").items()}
    observed.copy_lost = {t for t, n in publications.items() if n > receptions.get(t, 0)}
    observed.dead = {int(raw) for raw in control.smembers("dead")}
    observed.bodies = int(control.get("bodies") or 0)
    return observed


@dataclass
class Verdict:
    """The figures of the table and the violations found."""

    figures: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check(
    observed: Observed,
    stopped: set[int],
    terminated: set[str],
    taken_over: set[str],
    restarts: list[tuple[float, float]],
    untaken: set[str] | None = None,
) -> Verdict:
    verdict = Verdict()
    bad = verdict.violations.append
    records = observed.records
    # Skewed clocks, a connection cut mid-body and a refused result must not cost a second claim.
    # (Unless another fault killed or stopped the first holder: then a take-over is right.)
    for key in sorted(untaken or ()):
        record = records.get(key)
        first = {pid for pid, fence, _ in observed.ledger.get(key, []) if fence == 1}
        struck = bool(first & (observed.dead | stopped))
        if record is not None and (record.status, record.fence) != (Status.SUCCEEDED, 1) and not struck:
            bad(
                f"{key}: expected SUCCEEDED under its first claim, found {record.status} fence {record.fence}"
            )
    # The faults that kill a holder mid-body leave their mark: a later fence took the key over.
    for key in sorted(taken_over):
        record = records.get(key)
        if record is not None and record.status == Status.SUCCEEDED and record.fence < 2:
            bad(f"{key}: its holder was killed mid-body, yet fence {record.fence} completed it")
    # I1: the database effect of every key exists exactly once (none for a key that failed).
    for key in sorted(observed.keys):
        record = records.get(key)
        # Non-atomic bodies make no database effect: their effect is the external call (I6).
        atomic = record is not None and record.task_name in ATOMIC_TASKS
        wanted = 1 if atomic and record is not None and record.status == Status.SUCCEEDED else 0
        if observed.effects[key] != wanted:
            bad(f"I1 {key}: {observed.effects[key]} database effects, expected {wanted}")
    # I2 and I4: every key SUCCEEDED, or FAILED with a reason; none left IN_PROGRESS.
    lost = [key for key in observed.keys if key not in records]
    # kombu can lose a message popped by a SIGKILLed main process (its BRPOP window): a key none
    # of whose messages any worker received was lost by the broker, not by us; it is reported.
    received_keys = {key for task_id, key in observed.messages if task_id in observed.received}
    broker_lost = [key for key in lost if key not in received_keys]
    lost = [key for key in lost if key in received_keys]
    stuck = [key for key, record in records.items() if record.status == Status.IN_PROGRESS]
    # An outbox key still PENDING: its message never reached a worker and the re-drive did not
    # send it again. The outbox exists so that this never happens, whatever the broker lost.
    pending = [key for key, record in records.items() if record.status == Status.PENDING]
    for key in sorted(pending):
        bad(f"I2 {key}: still PENDING (its message was lost and never sent again)")
    lost += pending
    for key in sorted(set(lost) - set(pending)):
        bad(f"I2 {key}: no record (lost)")
    for key in sorted(stuck):
        bad(f"I4 {key}: still IN_PROGRESS (fence {records[key].fence})")
    failed = {key: r for key, r in records.items() if r.status == Status.FAILED}
    for key, record in sorted(failed.items()):
        if not (record.error or {}).get("message"):
            bad(f"I2 {key}: FAILED without a reason")
        if key not in observed.poison:
            bad(f"I2 {key}: FAILED ({(record.error or {}).get('type')}) though only poison should fail")
    for key in observed.poison - set(failed):
        bad(f"I2 {key}: the poison task did not end FAILED")
    # I3 and I5: every message answered, every answer of a key identical to the stored result.
    identical = unanswered = never_received = 0
    for task_id, key in observed.messages:
        answer = observed.answers.get(task_id)
        record = records.get(key)
        if answer is None:
            if task_id in observed.received and task_id not in observed.copy_lost:
                unanswered += 1
                bad(f"I5 {key}: message {task_id} was received but never answered")
            else:
                never_received += 1
                verdict.notes.append(
                    f"message {task_id} of {key}: a copy never reached a worker (broker loss)"
                )
            continue
        if (
            key in observed.poison
            and answer["status"] == "FAILURE"
            or record is not None
            and answer["status"] == "SUCCESS"
            and answer["result"] == record.result
        ):
            identical += 1
        else:
            bad(f"I3 {key}: message {task_id} answered {answer['status']} {answer['result']!r}")
    # I3 at the caller: a send of an outbox key that had succeeded returned the stored result.
    for key, value in observed.replayed:
        record = records.get(key)
        if record is not None and record.result == value:
            identical += 1
        else:
            bad(f"I3 {key}: the caller's replay returned {value!r}")
    # I6: every external call beyond the committed one is explained by an injected fault.
    beyond = explained = 0
    for key, entries in observed.ledger.items():
        record = records.get(key)
        committed = record.fence if record is not None and record.status == Status.SUCCEEDED else None
        extra = [e for e in entries if e[1] != committed]
        if committed is not None and sum(1 for e in entries if e[1] == committed) != 1:
            bad(f"I6 {key}: the committed fence {committed} made {len(entries) - len(extra)} calls")
        beyond += max(len(entries) - 1, 0)
        for pid, fence, at in extra:
            # A PostgreSQL restart rolls back every body in flight: those calls were cut off by it.
            restarted = any(start - RESTART_REACH <= at <= end for start, end in restarts)
            if pid in observed.dead or pid in stopped or key in terminated or restarted:
                explained += 1
            else:
                bad(f"I6 {key}: external call by pid {pid} at fence {fence} is not explained by a fault")
    explained = min(explained, beyond)
    verdict.figures.update(
        {
            "messages": len(observed.messages),
            "keys": len(observed.keys),
            "body executions": observed.bodies,
            "max database effects for a key": max(observed.effects.values(), default=0),
            "max external calls for a key": max((len(e) for e in observed.ledger.values()), default=0),
            "keys of non-atomic tasks": sum(1 for r in records.values() if r.task_name not in ATOMIC_TASKS),
            "keys SUCCEEDED": sum(1 for r in records.values() if r.status == Status.SUCCEEDED),
            "keys FAILED with a reason": len(failed),
            "keys lost": len(lost),
            "keys never delivered by the broker": len(broker_lost),
            "records stuck": len(stuck),
            "answers identical to the stored result": (
                f"{identical}/{len(observed.messages) + len(observed.replayed)}"
            ),
            "messages received but unanswered (hangs)": unanswered,
            "messages never delivered by the broker": never_received,
            "external calls beyond one": beyond,
            "  of which explained by injected faults": explained,
            "keys of outbox tasks": sum(1 for r in records.values() if r.task_name in OUTBOX_TASKS),
            "  sends attached at the caller": observed.attached,
            "  sends replayed at the caller": len(observed.replayed),
            "  messages dropped by the broker": len(observed.dropped),
            "  messages sent again by the re-drive": observed.redriven,
            "  keys left PENDING": len(pending),
        }
    )
    return verdict


def table(title: str, figures: dict[str, Any], injected: dict[str, int]) -> str:
    rows = [(name, str(value)) for name, value in figures.items()]
    rows += [(f"fault {kind}", str(n)) for kind, n in sorted(injected.items())]
    width = max(len(name) for name, _ in rows)
    lines = [title, "-" * (width + 12)]
    lines += [f"{name:<{width}}  {value:>8}" for name, value in rows]
    return "\n".join(lines)
