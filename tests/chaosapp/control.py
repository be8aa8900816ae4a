"""What the chaos tasks tell the harness through the control Redis, and the faults armed there.

Everything here lives outside PostgreSQL on purpose: a ledger entry survives the rollback of the
body it belongs to, which is what makes it an *external* call.
"""

from __future__ import annotations

import os
import signal
import time

from tests import db_sessions
from tests.testapp.faults import control as control  # the one client of the control Redis


def arm(point: str, key: str, action: str) -> None:
    """Make the next process reaching ``point`` for ``key`` do ``action`` ("kill" or "hold:<s>")."""
    control().set(f"point:{point}:{key}", action)


def died(pid: int) -> None:
    """Remember that ``pid`` was killed by an injected fault (it explains its extra calls)."""
    control().sadd("dead", pid)


def reached(point: str, key: str) -> None:
    """Fire the fault armed at ``point`` for ``key``, once (GETDEL)."""
    armed = control().getdel(f"point:{point}:{key}")
    if not armed:
        return
    action = armed.decode() if isinstance(armed, bytes) else str(armed)
    if action == "kill":
        died(os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.startswith("hold:"):
        # Tell the harness which process and which PostgreSQL backend hold the key, then stay
        # inside the body (and its transaction) long enough for it to SIGSTOP or terminate them.
        backend = db_sessions.backend_id()
        control().set(f"held:{key}", f"{os.getpid()} {backend}")
        time.sleep(float(action.split(":", 1)[1]))
        control().delete(f"held:{key}")  # the harness can tell whether it struck in time


def body_started() -> None:
    control().incr("bodies")


def external_call(key: str, fence: int, task_id: str) -> None:
    """Append to the external-call ledger: one entry per call the body makes outside the database."""
    control().rpush(f"ext:{key}", f"{os.getpid()} {fence} {task_id} {time.time():.3f}")


def received(task_id: str) -> None:
    """One more copy of ``task_id`` received by a worker."""
    control().hincrby("receptions", task_id, 1)


def published(task_id: str) -> None:
    """One more copy of ``task_id`` handed to the broker (an original, a re-queue, a duplicate)."""
    control().hincrby("publications", task_id, 1)
