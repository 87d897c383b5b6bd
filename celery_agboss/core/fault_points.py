"""Named fault points at commit boundaries.

Production code calls ``fault_point("name")`` where a crash or a race matters (right
before a COMMIT, between a lease check and a write, after a send). Nothing happens
unless a test armed the point through ``celery_agboss.testing.arm_fault`` — then the
point can pause (block on an event until released), sleep, or raise once, so a test
can put a zombie's write and a take-over at the same instant on purpose.

The registry is process-local and costs one dict lookup when nothing is armed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

# The points production code names. Tests refer to them by these constants.
LEASE_BEFORE_COMMIT = "lease.before-commit"
FENCED_BEFORE_BEGIN = "fenced.before-begin"
FENCED_AFTER_CHECK = "fenced.after-lease-check"
FENCED_BEFORE_COMMIT = "fenced.before-commit"
FENCED_AFTER_COMMIT = "fenced.after-commit"
OUTBOUND_AFTER_READ = "outbound.after-read"
OUTBOUND_BEFORE_RELY = "outbound.before-rely"  # a completed record read, its reliance not yet
UNDO_BEFORE_CLAIM = "undo.before-claim"  # a shared step's undo decided, not yet claimed
UNDO_BEFORE_COMPENSATED = "undo.before-compensated"  # an undo's mark written, the step not judged
OUTBOUND_BEFORE_SEND = "outbound.before-send"
OUTBOUND_AFTER_SEND = "outbound.after-send"
OUTBOUND_BEFORE_SETTLE = "outbound.before-settle"
RECONCILE_AFTER_LOOKUP = "reconcile.after-lookup"
RECONCILE_BEFORE_RESEND = "reconcile.before-resend"  # a NotSent to resend, not yet claimed
RENEWER_BEFORE_RENEW = "renewer.before-renew"
SWEEP_BEFORE_EXPIRY = "sweep.before-expiry"  # what may expire listed, its rows not yet locked
RESEAL_BEFORE_WRITE = "reseal.before-write"  # a batch re-sealed, not yet written back
DELIVERY_AFTER_VERDICT = "delivery.after-verdict"  # COMPLETED committed, Celery not yet told

KNOWN_POINTS = frozenset(
    {
        LEASE_BEFORE_COMMIT,
        FENCED_BEFORE_BEGIN,
        FENCED_AFTER_CHECK,
        FENCED_BEFORE_COMMIT,
        FENCED_AFTER_COMMIT,
        OUTBOUND_AFTER_READ,
        OUTBOUND_BEFORE_RELY,
        UNDO_BEFORE_CLAIM,
        UNDO_BEFORE_COMPENSATED,
        OUTBOUND_BEFORE_SEND,
        OUTBOUND_AFTER_SEND,
        OUTBOUND_BEFORE_SETTLE,
        RECONCILE_AFTER_LOOKUP,
        RECONCILE_BEFORE_RESEND,
        RENEWER_BEFORE_RENEW,
        SWEEP_BEFORE_EXPIRY,
        RESEAL_BEFORE_WRITE,
        DELIVERY_AFTER_VERDICT,
    }
)


@dataclass
class ArmedFault:
    """What an armed point does when reached: run ``action`` for the next ``times`` hits.

    ``only`` narrows the hits that count (e.g. one holder's thread): it gets the context
    keyword arguments the point was called with.
    """

    action: Callable[[dict[str, object]], None]
    times: int = 1
    only: Callable[[dict[str, object]], bool] | None = None
    hits: int = 0
    reached: threading.Event = field(default_factory=threading.Event)


_armed: dict[str, list[ArmedFault]] = {}
_lock = threading.Lock()


def fault_point(name: str, **context: object) -> None:
    """Mark a boundary where tests may inject a pause or a crash. Free when unarmed."""
    if not _armed:
        return
    with _lock:
        candidates = _armed.get(name)
        chosen: ArmedFault | None = None
        if candidates:
            for armed in candidates:
                if armed.times > 0 and (armed.only is None or armed.only(context)):
                    armed.times -= 1
                    armed.hits += 1
                    chosen = armed
                    break
    if chosen is not None:
        chosen.reached.set()
        chosen.action(dict(context))


def _arm(name: str, fault: ArmedFault) -> ArmedFault:
    if name not in KNOWN_POINTS:
        raise ValueError(f"unknown fault point {name!r}; known: {sorted(KNOWN_POINTS)}")
    with _lock:
        _armed.setdefault(name, []).append(fault)
    return fault


def _disarm_all() -> None:
    with _lock:
        _armed.clear()
