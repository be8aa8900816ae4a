"""The seeded schedule of a chaos run: which keys are sent when, and which faults fire when."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

BEFORE_COMPLETION = ("after_claim", "after_external", "after_effect")
AFTER_COMPLETION = ("postrun",)


@dataclass(frozen=True)
class Tier:
    """The size of a run and the faults it injects, by kind."""

    name: str
    keys: int
    messages: int
    multi_fraction: float
    burst_keys: int
    burst_size: int
    max_deliveries: int
    send_seconds: float
    faults: dict[str, int]


TIER1 = Tier(
    name="tier 1",
    keys=1000,
    messages=2000,
    multi_fraction=0.3,
    burst_keys=50,
    burst_size=20,
    max_deliveries=20,
    send_seconds=40,
    faults={
        "child_kill": 5,
        "main_kill": 1,
        "warm_shutdown": 1,
        "pause": 2,
        "short_lock": 1,
        "poison": 1,
        "lock_restart": 1,
        "client_pause": 2,
        "eviction": 1,
        "clock_jump": 1,
        "backend_kill": 2,
        "stale_row": 1,
        "skew_ahead": 1,
        "skew_behind": 1,
        "connection_cut": 2,
        "refused_value": 2,
        "broker_drop": 2,
    },
)

SOAK = Tier(
    name="soak",
    keys=5000,
    messages=10_000,
    multi_fraction=0.3,
    burst_keys=100,
    burst_size=20,
    max_deliveries=20,
    send_seconds=300,
    faults={
        "child_kill": 25,
        "main_kill": 5,
        "warm_shutdown": 1,
        "pause": 5,
        "short_lock": 1,
        "poison": 1,
        "lock_restart": 5,
        "client_pause": 2,
        "eviction": 1,
        "clock_jump": 1,
        "backend_kill": 10,
        "stale_row": 1,
        "pg_restart": 2,
    },
)


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: its kind, when it fires (s after the start) and its target."""

    kind: str
    at: float
    key: str = ""
    point: str = ""
    worker: int = 0


@dataclass
class Plan:
    """Everything a seed decides."""

    seed: int
    tier: Tier
    sends: list[tuple[float, str]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return sorted({key for _, key in self.sends} | {f.key for f in self.faults if f.kind in KEYED})


# Faults that send their own key and strike while its holder is inside the body; the lock-Redis
# faults then send a duplicate, which the database lease must turn away.
KEYED = (
    "pause",
    "backend_kill",
    "lock_restart",
    "eviction",
    "clock_jump",
    "skew_ahead",
    "skew_behind",
    "connection_cut",
    "refused_value",
    "broker_drop",
)
# Of those, the faults whose key must complete under its first claim: no take-over, one body.
UNTAKEN = ("skew_ahead", "skew_behind", "connection_cut", "refused_value", "broker_drop")


def seed_from_env() -> int:
    """CHAOS_SEED replays a run; without it every run draws a new seed."""
    value = os.environ.get("CHAOS_SEED")
    return int(value) if value else random.SystemRandom().randrange(1, 2**31)


def value_of(key: str) -> int:
    return int(key.rsplit("-", 1)[1])


def is_outbox(key: str) -> bool:
    """A fifth of the keys run as outbox tasks (outbox=True): recorded PENDING by the sender."""
    return value_of(key) % 5 == 0


def make_plan(tier: Tier, seed: int) -> Plan:
    """Draw the deliveries of every key and the time and target of every fault from ``seed``."""
    rng = random.Random(seed)
    keys = [f"k-{n}" for n in range(tier.keys)]
    rng.shuffle(keys)
    multi = int(tier.keys * tier.multi_fraction)
    bursts, others, singles = keys[: tier.burst_keys], keys[tier.burst_keys : multi], keys[multi:]
    deliveries = dict.fromkeys(others, 2)
    extra = tier.messages - tier.burst_keys * tier.burst_size - len(singles) - 2 * len(others)
    while extra > 0:
        key = rng.choice(others)
        if deliveries[key] < tier.max_deliveries:
            deliveries[key] += 1
            extra -= 1
    # Keys the keyed faults send themselves, taken from the single-delivery keys.
    counts = tier.faults
    keyed = {kind: [singles.pop() for _ in range(counts.get(kind, 0))] for kind in KEYED}
    window = tier.send_seconds
    plan = Plan(seed=seed, tier=tier)
    for key in bursts:
        at = rng.uniform(0, window)
        plan.sends += [(at, key)] * tier.burst_size
    for key, count in deliveries.items():
        plan.sends += [(rng.uniform(0, window), key) for _ in range(count)]
    plan.sends += [(rng.uniform(0, window), key) for key in singles]
    plan.sends.sort()

    def when() -> float:
        # Faults strike while messages still flow, never in the first or the last seconds.
        return round(rng.uniform(0.1 * window, 0.85 * window), 2)

    sent = [key for _, key in plan.sends]
    points = list(BEFORE_COMPLETION + AFTER_COMPLETION)
    for n, key in enumerate(rng.sample(sorted(set(sent)), counts.get("child_kill", 0))):
        point = points[n] if n < len(points) else rng.choice(points)
        plan.faults.append(Fault("child_kill", 0, key=key, point=point))
    for kind, targets in keyed.items():
        plan.faults += [Fault(kind, when(), key=key) for key in targets]
    # A stale IN_PROGRESS row of an outbox key would be attached to by its sender, which then
    # publishes nothing: outside a crash, such a row always has its message in the broker.
    spare = {key for key in singles if not is_outbox(key)} - {f.key for f in plan.faults}
    stale = rng.sample(sorted(spare), counts.get("stale_row", 0))
    plan.faults += [Fault("stale_row", 0, key=key) for key in stale]
    for kind in ("main_kill", "warm_shutdown"):
        plan.faults += [Fault(kind, when(), worker=rng.randrange(2)) for _ in range(counts.get(kind, 0))]
    for kind in ("short_lock", "poison"):
        plan.faults += [Fault(kind, when(), key=f"{kind}-{n}") for n in range(counts.get(kind, 0))]
    for kind in ("client_pause", "pg_restart"):
        plan.faults += [Fault(kind, when()) for _ in range(counts.get(kind, 0))]
    plan.faults.sort(key=lambda fault: (fault.at, fault.kind, fault.key))
    return plan
