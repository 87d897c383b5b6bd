"""The fault schedule: which fault, when, at whom — all drawn from one seeded RNG.

The whole schedule is drawn before anything starts, so ``--seed`` replays the same
faults at the same offsets against the same worker numbers. What a fault finds when
it fires (which order is charging, which pool child has which pid) depends on timing
and is printed as it happens.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class FaultKind(str, enum.Enum):
    """A fault the explorer can throw (``--faults`` takes these names)."""

    KILL_CHILD = "kill-child"  # SIGKILL a random pool child (its worker forks another)
    KILL_CHILD_AFTER_CHARGE = (
        "kill-child-after-charge"  # SIGKILL the child whose charge went through
    )
    KILL_WORKER = "kill-worker"  # SIGKILL a whole worker (main and pool); restarted
    SIGTERM_WORKER = "sigterm-worker"  # warm shutdown of a worker; restarted
    FREEZE_CHILD_AFTER_CHARGE = "freeze-child-after-charge"  # SIGSTOP past the lease, SIGCONT
    FREEZE_WORKER = "freeze-worker"  # SIGSTOP a whole worker at a random moment (opt-in)
    ANSWER_THEN_DROP = "answer-then-drop"  # the gateway charges, the answer is lost
    FAIL_BEFORE_PROCESSING = "fail-before-processing"  # the gateway fails, nothing charged
    SLOW = "slow"  # the gateway answers after a delay (shorter than the client's timeout)


DEFAULT_KINDS: tuple[FaultKind, ...] = tuple(
    k for k in FaultKind if k is not FaultKind.FREEZE_WORKER
)
"""Every kind but ``freeze-worker``: a freeze landing between the lease check and the
bytes leaving makes a late send that only the gateway's idempotency key absorbs
(design: A6), and the explorer's gateway deliberately does not deduplicate."""


@dataclass(frozen=True)
class Fault:
    """One planned fault: ``at`` seconds after the first order, against worker ``worker``."""

    number: int
    at: float
    kind: FaultKind
    worker: int  # index of the target worker (process faults)
    pick: float  # in [0, 1): which pool child, where one is chosen
    seconds: float  # a slow answer's delay, or how long past the lease a freeze lasts


def parse_kinds(text: str) -> tuple[FaultKind, ...]:
    """``"kill-child,slow"`` → the kinds; ``"all"`` → every kind; ValueError names the bad one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return tuple(FaultKind)
    kinds: list[FaultKind] = []
    for name in names:
        try:
            kinds.append(FaultKind(name))
        except ValueError:
            known = ", ".join(k.value for k in FaultKind)
            raise ValueError(f"unknown fault kind {name!r} (known: {known}, or all)") from None
    if not kinds:
        raise ValueError("no fault kind given")
    return tuple(dict.fromkeys(kinds))


def plan(
    seed: int,
    kinds: tuple[FaultKind, ...],
    count: int,
    window: float,
    workers: int,
    *,
    first: FaultKind | None = None,
) -> list[Fault]:
    """``count`` faults spread over ``window`` seconds (at least a second apart where it
    fits), kinds drawn from ``kinds``; ``first`` forces the first fault's kind."""
    rng = random.Random(seed)
    if count <= 0 or not kinds:
        return []
    start = min(2.0, window / 4)
    offsets = sorted(rng.uniform(start, window) for _ in range(count))
    spaced: list[float] = []
    gap = min(1.0, (window - start) / max(count, 1))
    for offset in offsets:
        spaced.append(max(offset, spaced[-1] + gap) if spaced else offset)
    faults = []
    for number, at in enumerate(spaced, start=1):
        kind = first if number == 1 and first is not None else rng.choice(kinds)
        faults.append(
            Fault(
                number=number,
                at=round(at, 2),
                kind=kind,
                worker=rng.randrange(workers),
                pick=rng.random(),
                seconds=round(rng.uniform(1.0, 3.0), 2),
            )
        )
    return faults


__all__ = ["DEFAULT_KINDS", "Fault", "FaultKind", "parse_kinds", "plan"]
