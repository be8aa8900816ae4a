"""What every history must converge to after one struck delivery, and the matrix that reports it."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from django_idempotent_tasks.models import IdempotencyRecord
from tests.chaos.checker import read_answers, text
from tests.chaosapp.models import ChaosEffect
from tests.explorer.cells import CRASHES, FAULTS
from tests.explorer.tasks import EFFECTS, MAX_ATTEMPTS
from tests.testapp.faults import control

if TYPE_CHECKING:
    from tests.explorer.harness import Run

Status = IdempotencyRecord.Status


def crash_window(order: list[str], fault: str) -> tuple[int, int] | None:
    """Where ``fault`` may repeat the external call (RELIABILITY.md I6): a crash between the call
    and the completion commit; a pause (W6) anywhere between the claim and that commit, since the
    resumed holder learns of the takeover only at its next fenced write."""
    after = [n for n, bid in enumerate(order) if bid.endswith(":after")]
    marks = ("external:call#",) if fault != "pause" else ("@store.insert#", "@store.take_over#")
    starts = [n for n in after if any(mark in order[n] for mark in marks)]
    ends = [n for n in after if "@store.complete#" in order[n]]
    if not starts or not ends:
        return None
    return starts[0], ends[-1]


def check(run: Run, task_ids: list[str], order: list[str]) -> None:
    """Append to ``run.violations`` every invariant the key's history breaks."""
    bad = run.violations.append
    kind, key = run.cell.kind, run.key
    record = IdempotencyRecord.objects.filter(key=key).first()
    if record is None:
        bad("I2 no record")
        return
    exhausted = (
        kind == "flaky"
        and record.status == Status.FAILED
        and record.attempts >= MAX_ATTEMPTS
        and (record.error or {}).get("type") == "AttemptsExhausted"
    )
    if record.status == Status.IN_PROGRESS:
        bad(f"I4 IN_PROGRESS (fence {record.fence}) with no live holder")
    elif record.status != Status.SUCCEEDED and not exhausted:
        bad(
            f"I2 ended {record.status}: {(record.error or {}).get('type')} {(record.error or {}).get('message')}"
        )
    done = record.status == Status.SUCCEEDED
    counts = Counter(ChaosEffect.objects.filter(key=key).values_list("task", flat=True))
    for name in EFFECTS[kind]:
        if counts[name] != (1 if done else 0):
            bad(f"I1 {counts[name]} database effects {name}, expected {1 if done else 0}")
    _check_external(run, record, order)
    answers = read_answers(task_ids)
    for task_id in task_ids:
        answer = answers.get(task_id, {})
        status, result = answer.get("status"), answer.get("result")
        if done and (status, result) != ("SUCCESS", record.result):
            bad(f"I3 message {task_id[:8]} answered {status} {result!r}, stored {record.result!r}")
        if not done and status != "FAILURE":
            bad(f"I3 message {task_id[:8]} answered {status} though the key failed for good")


def _check_external(run: Run, record: IdempotencyRecord, order: list[str]) -> None:
    if run.cell.kind != "external":
        return
    calls = [text(entry).split() for entry in control().lrange(f"explore:ext:{run.key}", 0, -1)]
    if record.status == Status.SUCCEEDED and not calls:
        run.violations.append("I6 succeeded without its external call")
    extra = calls[1:]
    if not extra:
        return
    window = crash_window(order, run.cell.fault)
    at = order.index(run.cell.boundary) if run.cell.boundary in order else -1
    inside = window is not None and window[0] <= at < window[1]
    # The holder that took over must have been told (after a pause, the resumed holder's call
    # may come last, so look at the newest fence, not the latest call).
    newest = max(int(fence) for _, fence, _ in calls)
    told = all(recovered == "1" for _, fence, recovered in calls if int(fence) == newest)
    for pid, fence, recovered in extra:
        if run.struck and run.cell.fault in CRASHES and inside and told:
            run.extra_calls += 1
        else:
            run.violations.append(
                f"I6 extra external call by pid {pid} at fence {fence} (recovered={recovered == '1'}) "
                f"not explained by {run.cell.fault} at {run.cell.boundary}"
            )


def matrix(kind: str, boundaries: list[Any], runs: dict[str, Run]) -> str:
    """One row per boundary, one column per fault: ok, ok+Next (explained extra calls), FAIL,
    unreached (the boundary did not occur in that run), no-conn (no database connection was open
    there to kill or cut), '-' (not applicable), '.' (not run)."""
    width = max(len(b.id) for b in boundaries)
    lines = [
        f"{kind}: {len(boundaries)} boundaries",
        f"{'boundary':<{width}}  " + " ".join(f"{f:>16}" for f in FAULTS),
    ]
    for boundary in boundaries:
        row = []
        for fault in FAULTS:
            run = runs.get(f"{kind}:{boundary.id}:{fault}")
            row.append(run.outcome if run is not None else ".")
        lines.append(f"{boundary.id:<{width}}  " + " ".join(f"{cell:>16}" for cell in row))
    return "\n".join(lines)


def totals(recordings: dict[str, list[Any]], runs: dict[str, Run]) -> str:
    by_fault = Counter(run.cell.fault for run in runs.values() if run.struck and run.applied)
    idle = Counter(run.cell.fault for run in runs.values() if run.struck and not run.applied)
    failures = [run for run in runs.values() if run.violations]
    extra = [run for run in runs.values() if run.extra_calls]
    lines = [
        "boundaries: " + ", ".join(f"{kind} {len(b)}" for kind, b in recordings.items()),
        f"runs: {len(runs)}, struck: {sum(by_fault.values())}, unreached: "
        f"{sum(1 for run in runs.values() if not run.struck)}, "
        f"wall time {sum(run.seconds for run in runs.values()):.0f} s",
        "faults struck: " + ", ".join(f"{fault} {by_fault[fault]}" for fault in FAULTS),
        "no connection open to strike: " + (", ".join(f"{f} {n}" for f, n in idle.items()) or "none"),
        f"extra external calls: {sum(run.extra_calls for run in extra)}",
    ]
    lines += [f"  {run.extra_calls} by {run.cell.id} (the next holder saw recovered)" for run in extra]
    lines.append(f"failures: {len(failures)}")
    for run in failures:
        lines.append(f"  EXPLORE_CELL={run.cell.id}  {'; '.join(run.violations)}  [{'; '.join(run.notes)}]")
    return "\n".join(lines)
