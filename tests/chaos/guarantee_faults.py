"""The faults of the guarantee under ordinary production trouble: skewed clocks (C1, C2), a
connection cut mid-body (P7) and a result the database refuses (V1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_idempotent_tasks import keys
from tests.chaos.plan import Fault
from tests.chaosapp import control
from tests.chaosapp.tasks import URGENT, chaos_cut, chaos_external, chaos_refused

if TYPE_CHECKING:
    from tests.chaos.faults import Context


def skewed(ctx: Context, fault: Fault, holder: str, duplicate: str) -> None:
    """C1/C2: the lock of a key held mid-body vanishes and a worker on another clock gets the duplicate."""
    value = int(fault.key.rsplit("-", 1)[1])
    control.arm("after_effect", fault.key, "hold:4")
    ctx.send(chaos_external, fault.key, (value,), queue=holder)
    ctx.holder(fault.key)
    with ctx.redis_faults:
        ctx.lock_redis.client().delete(keys.lock_name(chaos_external.name, fault.key))
        ctx.send(chaos_external, fault.key, (value,), queue=duplicate)
    ctx.done(fault.kind, f"{fault.key} held on {holder}, lock deleted, duplicate sent to {duplicate}")


def connection_cut(ctx: Context, fault: Fault) -> None:
    """P7: the server cuts the body's idle connection; the completion reconnects."""
    ctx.send(chaos_cut, fault.key, (int(fault.key.rsplit("-", 1)[1]),))
    ctx.done("connection_cut", f"{fault.key}: the server drops its idle session after 1 s, body sleeps 3 s")


def refused_value(ctx: Context, fault: Fault) -> None:
    """V1: a NaN result, sent twice: one body, the key done, both answers identical."""
    for _ in range(2):
        ctx.send(chaos_refused, fault.key, (int(fault.key.rsplit("-", 1)[1]),))
    ctx.done("refused_value", f"{fault.key}: returns NaN")


def skew_ahead(ctx: Context, fault: Fault) -> None:
    """C1: the duplicate goes to the worker 300 s ahead, which must not take the live lease over."""
    skewed(ctx, fault, URGENT, "chaos.ahead")


def skew_behind(ctx: Context, fault: Fault) -> None:
    """C2: the holder runs 300 s behind; its lease must still be live for the duplicate."""
    skewed(ctx, fault, "chaos.behind", URGENT)
