"""The smallest honest demonstration: a zombie is fenced, and a lost answer is charged once.

Run ``python -m celery_agboss.demo`` (``make demo``). On a fresh SQLite store in a
temporary directory, with the database clock moved by a ``VirtualClock`` instead of
waiting, it tells two stories step by step:

1. the fence — holder A writes under token 1; A's lease expires; holder B takes over
   with token 2; A, now a zombie, tries to write and is refused in the same
   transaction that checks its lease; B's write is the one stored;
2. the outbound call — A charges, the gateway processes the payment but the answer is
   lost; A dies; B takes over, reconciles by looking the key up at the gateway, and
   the customer is charged once.

Every step checks what happened against the expected story and the process exits 1
on the first deviation: the demo can fail, so its success means something.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.outbound import Completed, NotSent, OutboundCall, Outcome
from celery_agboss.core.store import EffectRecord, LeaseRef, Store
from celery_agboss.errors import (
    AGBossSignal,
    ExecutionFencedError,
    OutboundCallOutcomeUnknownError,
)
from celery_agboss.store.migrate import migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_types import FakeGatewayFault

TTL_MS = 30_000
PSEUDONYM_KEY = b"celery-agboss-demo-pseudonym-key-not-a-secret"


class Deviation(Exception):
    """The demo's story did not happen as told."""


class Story:
    """Numbered, printed steps; each one checks its own claim."""

    def __init__(self) -> None:
        self.number = 0

    def step(self, text: str, holds: bool, detail: str = "") -> None:
        self.number += 1
        print(f"{self.number:>2}. {text}")
        if not holds:
            raise Deviation(f"step {self.number} did not happen as told: {text} ({detail})")

    @staticmethod
    def title(text: str) -> None:
        print(f"\n== {text} ==")


def _write(store: Store, lease: LeaseRef, key: str, result: dict[str, Any]) -> bool:
    """Record ``result`` under ``key`` in a fenced transaction (True: this call wrote it)."""
    with store.fenced(lease, TTL_MS) as tx:
        if tx.read_effect(key) is not None:
            return False
        return tx.insert_effect(
            EffectRecord(key, lease.scope, key.rsplit(":", 1)[-1], result, lease.token, 0)
        )


def fence_story(store: Store, advance: Any, story: Story) -> None:
    """A zombie's write after a take-over is refused; the new holder's write stands."""
    story.title("a zombie is fenced")
    scope = "demo:order-42"
    a = store.acquire_lease(scope, f"A-{uuid.uuid4().hex[:8]}", TTL_MS)
    story.step(
        f"holder A acquires the lease of {scope}: token {a.lease.token if a else None}",
        a is not None and a.lease.token == 1,
    )
    assert a is not None
    wrote = _write(store, a.lease, f"{scope}:reserve-stock", {"by": "A"})
    story.step("A writes the fenced effect 'reserve-stock' under token 1", wrote)

    advance(TTL_MS / 1000 + 1)
    state = store.read_lease(scope)
    story.step(
        f"the database clock moves {TTL_MS // 1000 + 1} s: A's lease has expired "
        f"(live={state.live if state else None}); A does not know yet",
        state is not None and not state.live,
    )
    b = store.acquire_lease(scope, f"B-{uuid.uuid4().hex[:8]}", TTL_MS)
    story.step(
        f"holder B takes over: token {b.lease.token if b else None}",
        b is not None and b.lease.token == 2 and b.took_over,
    )
    assert b is not None

    key = f"{scope}:mark-paid"
    try:
        _write(store, a.lease, key, {"by": "A"})
        refused = False
    except ExecutionFencedError:
        refused = True
    story.step("zombie A tries to write 'mark-paid' -> refused: ExecutionFencedError", refused)
    story.step("nothing of A's write is stored", store.read_effect(key) is None)

    story.step("B writes 'mark-paid' under token 2", _write(store, b.lease, key, {"by": "B"}))
    row = store.read_effect(key)
    story.step(
        f"stored row: key={row.key!r} result={row.result} token={row.token}"
        if row
        else "stored row: none",
        row is not None and row.result == {"by": "B"} and row.token == b.lease.token,
    )


def charge_story(store: Store, advance: Any, story: Story) -> None:
    """A lost answer is reconciled, not resent: one payment at the gateway."""
    story.title("a lost answer is charged once")
    gateway = FakeGateway()

    def send(call: Any) -> Any:
        return gateway.charge(call.request["amount"], call.idempotency_key)

    def reconcile(call: Any, lookup: Any) -> Any:
        found = gateway.lookup(lookup.idempotency_key)
        return NotSent() if found is None else Completed(found)

    charge = OutboundCall(
        name="demo.charge", send=send, reconcile=reconcile, key_retention=timedelta(hours=24)
    )
    settings = EngineSettings(pseudonym_key=PSEUDONYM_KEY, lease_ttl_ms=TTL_MS)
    settings.register(charge)
    execution = "demo-order-43"
    request = {"amount": 1000, "currency": "usd"}

    a = ExecutionContext.start(store, execution, settings)
    story.step(
        f"holder A starts execution {execution}: token {a.lease_ref.token}", a.lease_ref.token == 1
    )
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    try:
        a.outbound(charge, request, business_key="order:43")
        unknown = False
    except OutboundCallOutcomeUnknownError:
        unknown = True
    story.step(
        "A charges 10.00 USD; the gateway processes it but the answer is lost -> "
        "OutboundCallOutcomeUnknownError",
        unknown and len(gateway.payments) == 1,
        f"payments={len(gateway.payments)}",
    )
    intents = _intents(store, execution)
    story.step(
        "the intent stays PENDING, possibly sent: "
        + ", ".join(f"{i.idempotency_key} {i.status.value} attempt {i.attempt}" for i in intents),
        [i.status.value for i in intents] == ["PENDING"],
    )
    state = store.read_lease(a.lease_ref.scope)
    story.step(
        "A's worker dies without releasing its lease",
        state is not None and state.live and state.token == 1,
    )

    advance(TTL_MS / 1000 + 1)
    b = ExecutionContext.start(store, execution, settings)
    story.step(
        f"after its expiry, holder B takes over: token {b.lease_ref.token}", b.lease_ref.token == 2
    )
    receipt = b.outbound(charge, request, business_key="order:43")
    story.step(
        f"B runs the same step: the pending intent is reconciled by a lookup, nothing is sent "
        f"(outcome {b.last_outcome.value if b.last_outcome else None}, payment {receipt['id']})",
        b.last_outcome is Outcome.RECONCILED and len(gateway.requests) == 1,
        f"requests={len(gateway.requests)}",
    )
    # A frozen copy of A's delivery wakes up, still holding token 1, and charges again.
    zombie = ExecutionContext(store, a.lease, execution, settings)
    try:
        zombie.outbound(charge, request, business_key="order:43")
        fenced = False
    except ExecutionFencedError:
        fenced = True
    story.step(
        "zombie A (token 1) wakes up and retries its charge -> refused: "
        "ExecutionFencedError, nothing sent",
        fenced and len(gateway.requests) == 1,
    )
    b.release()
    intents = _intents(store, execution)
    story.step(
        "the intent is COMPLETED by B's reconcile: "
        + ", ".join(
            f"{i.status.value} attempt {i.attempt} token {i.owner.token}"
            for i in intents
            if i.owner is not None
        ),
        [(i.status.value, i.attempt) for i in intents] == [("COMPLETED", 1)],
    )
    payments = gateway.payments
    story.step(
        f"the gateway saw {len(gateway.requests)} charge request and made "
        f"{len(payments)} payment: {[p['id'] for p in payments]}",
        len(payments) == 1 and payments[0]["id"] == receipt["id"],
    )


def _intents(store: Store, execution_id: str) -> list[Any]:
    """Every intent of one execution (the SQLAlchemy store's additive listing)."""
    with store.transaction() as tx:
        listing = getattr(tx, "list_intents", None)
        return [] if listing is None else list(listing(execution_id))


def run(directory: Path) -> None:
    """Tell both stories on a fresh SQLite store in ``directory``; raises ``Deviation``."""
    url = f"sqlite:///{directory.resolve() / 'agboss-demo.db'}"
    migrate(url)
    clock = VirtualClock()
    store = SQLAlchemyStore(url, clock_offset_source=clock.offset_ms)
    print(f"store: {url} (database clock moved by a VirtualClock, never by sleeping)")
    story = Story()
    try:
        fence_story(store, clock.advance, story)
        charge_story(store, clock.advance, story)
    except (Exception, AGBossSignal) as exc:
        if isinstance(exc, Deviation):
            raise
        raise Deviation(
            f"after step {story.number}: unexpected {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    del argv
    # The engine's own log lines (an unknown outcome, a reconcile) belong in the story.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("      log: %(message)s"))
    logger = logging.getLogger("celery_agboss")
    logger.addHandler(handler)
    try:
        return _main()
    finally:
        logger.removeHandler(handler)


def _main() -> int:
    with tempfile.TemporaryDirectory(prefix="agboss-demo-") as directory:
        try:
            run(Path(directory))
        except Deviation as deviation:
            print(f"\nDEMO FAILED: {deviation}", file=sys.stderr)
            return 1
    print("\nAs told: the zombie wrote nothing, and the customer was charged once.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
