"""What every contract case shares: the store factory, the clock, threads that cannot hang."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager

from celery_agboss.core.store_protocol import JSON, EffectRecord, LeaseRef, NewIntent, Store
from celery_agboss.errors import ExecutionFencedError
from celery_agboss.testing.clock import VirtualClock

StoreFactory = Callable[[], Store]
"""Opens a new store (its own connections) on the shared, migrated database under test."""

TTL_MS = 10_000
"""Lease time to live in the store-level cases: the virtual clock jumps past it."""

JOIN_SECONDS = 30.0
"""Upper bound on any thread a case starts; a backend that hangs fails, it does not hang us."""


class ContractViolation(AssertionError):
    """A backend broke a guarantee of the store contract (the message names which)."""


def require(condition: bool, guarantee: str, message: str) -> None:
    if not condition:
        raise ContractViolation(f"[{guarantee}] {message}")


def new_scope(prefix: str) -> str:
    return f"contract:{prefix}:{uuid.uuid4().hex}"


def new_holder() -> str:
    return uuid.uuid4().hex


@contextmanager
def open_stores(factory: StoreFactory, count: int, clock: VirtualClock) -> Iterator[list[Store]]:
    """``count`` stores from ``factory``, all on ``clock``, closed on leaving the block."""
    with ExitStack() as stack:
        stores: list[Store] = []
        for _ in range(count):
            store = factory()
            stack.callback(store.close)
            clock.attach(store)
            stores.append(store)
        yield stores


def acquire(store: Store, scope: str, ttl_ms: int = TTL_MS) -> LeaseRef:
    grant = store.acquire_lease(scope, new_holder(), ttl_ms)
    require(grant is not None, "P1", f"a free scope {scope!r} could not be acquired")
    assert grant is not None
    return grant.lease


def new_intent(key: str, lease: LeaseRef, by: str | None = None) -> NewIntent:
    """The contract's charge: ``key`` claimed by ``lease`` for its execution. ``by`` marks
    the claimer in the fingerprint and the request, to tell which of racing claims won."""
    return NewIntent(
        idempotency_key=key,
        execution_id=lease.scope,
        name="contract.charge",
        business_key_handle=None,
        fingerprint="fp" if by is None else by,
        request={} if by is None else {"by": by},
        owner=lease,
    )


def expire(clock: VirtualClock, ttl_ms: int = TTL_MS) -> None:
    """Move the database clock past every lease granted with ``ttl_ms`` before now."""
    clock.advance(ttl_ms / 1000 + 1)


def write_effect(
    store: Store, lease: LeaseRef, key: str, result: JSON, ttl_ms: int = TTL_MS
) -> tuple[bool, EffectRecord]:
    """Record-and-replay in one fenced transaction: (written by this call, the stored record)."""
    with store.fenced(lease, ttl_ms) as tx:
        existing = tx.read_effect(key)
        if existing is not None:
            return False, existing
        record = EffectRecord(
            key=key,
            execution_id=lease.scope,
            name="contract.effect",
            result=result,
            token=lease.token,
            created_at_ms=0,
        )
        if not tx.insert_effect(record):
            stored = tx.read_effect(key)
            require(stored is not None, "P2", "an insert that lost a race found no winner's row")
            assert stored is not None
            return False, stored
    stored = store.read_effect(key)
    require(stored is not None, "P2", f"a committed fenced effect {key!r} cannot be read back")
    assert stored is not None
    return True, stored


def is_fenced(store: Store, lease: LeaseRef) -> bool:
    try:
        with store.fenced(lease, TTL_MS):
            return False
    except ExecutionFencedError:
        return True


def run_threads(targets: Sequence[Callable[[], None]], what: str) -> None:
    """Run ``targets`` in threads; re-raise the first error; a thread that hangs is a failure."""
    errors: list[BaseException] = []

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # surfaced to the caller below
                errors.append(exc)

        return run

    threads = [
        threading.Thread(target=wrap(t), name=f"contract-{what}-{i}", daemon=True)
        for i, t in enumerate(targets)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + JOIN_SECONDS
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [thread.name for thread in threads if thread.is_alive()]
    if hung:
        raise ContractViolation(f"{what}: threads still running after {JOIN_SECONDS:g}s: {hung}")
    if errors:
        raise errors[0]
