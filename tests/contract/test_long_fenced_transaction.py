"""§5: a 10-second fenced transaction fences no other execution.

One worker process (one store, one ``LeaseRenewer``) holds several leases; one of its
executions runs a fenced effect for 10 real seconds. TTL 18 s on both backends
(renewals every 6 s); why that number, per backend:

- PostgreSQL: the renewer's one statement must skip the locked row (``SKIP LOCKED``:
  ``BUSY``) and go on renewing the others. The test records every renewal round and
  every observed expiry: a round sent during the effect must return at once, and no
  other lease may go longer than one renewal interval (+1.5 s) without moving. A
  renewer that waited for the row lock would sit 4 s in its round and leave a 10 s
  gap — both seen. The slow lease itself is extended by its own transaction (to its
  start + TTL) and by the renewer's first round after the commit, 12 s in: the TTL
  must exceed that (a BUSY round does not extend it), so not 12 s.
- SQLite: one writer for the whole database, so every renewal waits its turn; what
  must hold is that no lease is lost: the renewer neither gives up nor marks anything
  lost, and its waiting round lands right after the commit. A lease last renewed up to
  6 s before the effect began has 12 s left, so a renewer that gave up and came back a
  round later (16 s) would lose it.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy.sql.selectable import Select

from celery_agboss.core.lease import LeaseHandle, LeaseRenewer, SentAt, acquire
from celery_agboss.core.store import EffectRecord, LeaseRef, RenewOutcome
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from tests.contract.conftest import StoreFactory
from tests.support.processes import wait_until

LONG_SECONDS = 10.0
OTHERS = 3
TTL_MS = 18_000
INTERVAL_SECONDS = TTL_MS / 3000
SAMPLE_SECONDS = 0.2


@dataclass(frozen=True)
class Round:
    started: float
    finished: float
    outcomes: dict[LeaseRef, RenewOutcome]


class RecordingStore:
    """The worker's store, recording every renewal round the renewer sends."""

    def __init__(self, inner: SQLAlchemyStore) -> None:
        self.inner = inner
        self.rounds: list[Round] = []
        self._lock = threading.Lock()

    def renew_leases(self, leases: Sequence[LeaseRef], ttl_ms: int) -> dict[LeaseRef, RenewOutcome]:
        started = time.monotonic()
        outcomes = self.inner.renew_leases(leases, ttl_ms)
        with self._lock:
            self.rounds.append(Round(started, time.monotonic(), dict(outcomes)))
        return outcomes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class SlowEffectRun:
    """What happened around one slow fenced effect (times on the monotonic clock)."""

    slow: LeaseRef
    others: list[LeaseRef]
    rounds: list[Round]
    began: float = 0.0
    committed: float = 0.0
    began_db_ms: int = 0
    extended_to_ms: int = 0
    db_now_at_commit_ms: int = 0
    lost_handles: int = 0
    samples: list[tuple[float, dict[LeaseRef, tuple[int, bool]]]] = field(default_factory=list)
    slow_live_after: bool = False

    def during(self) -> list[Round]:
        """Renewal rounds sent while the slow transaction was open."""
        return [r for r in self.rounds if self.began <= r.started < self.committed]

    def after_commit(self) -> list[Round]:
        return [r for r in self.rounds if r.finished >= self.committed and self.slow in r.outcomes]

    def lost(self) -> list[LeaseRef]:
        return [ref for r in self.rounds for ref, o in r.outcomes.items() if o is RenewOutcome.LOST]

    def dead_samples(self) -> list[tuple[float, LeaseRef]]:
        return [
            (at - self.began, ref)
            for at, states in self.samples
            for ref, (_, live) in states.items()
            if not live
        ]

    def longest_gap(self, ref: LeaseRef) -> float:
        """The longest time the observed expiry of ``ref`` stood still during the effect."""
        moves: list[float] = []
        last: int | None = None
        for at, states in self.samples:
            expires, _ = states[ref]
            if last is not None and expires > last:
                moves.append(at)
            last = expires
        edges = [self.began, *moves, self.committed]
        return max(later - earlier for earlier, later in itertools.pairwise(edges))

    def timeline(self) -> str:
        lines = [f"effect began 0.00s, committed {self.committed - self.began:.2f}s"]
        lines += [
            f"round {r.started - self.began:.2f}s..{r.finished - self.began:.2f}s: "
            f"slow={r.outcomes.get(self.slow)} "
            f"others={sorted({o.value for ref, o in r.outcomes.items() if ref != self.slow})}"
            for r in self.rounds
        ]
        return "\n".join(lines)


def run_slow_effect(store_factory: StoreFactory) -> SlowEffectRun:
    """One worker's renewer tracks OTHERS + 1 leases; one of them runs a fenced effect
    for LONG_SECONDS; an observer (another process's view) samples the others."""
    worker = RecordingStore(store_factory())
    observer = store_factory()
    renewer = LeaseRenewer(worker)  # type: ignore[arg-type]
    handles: list[LeaseHandle] = []
    for _ in range(OTHERS + 1):
        handle = acquire(worker.inner, f"long:{uuid.uuid4().hex}", ttl_ms=TTL_MS)
        assert handle is not None
        handles.append(handle)
    slow = handles[0]
    run = SlowEffectRun(slow.ref, [h.ref for h in handles[1:]], worker.rounds)
    in_transaction = threading.Event()
    finished = threading.Event()

    def slow_effect() -> None:
        sent = SentAt.now(slow.clock)
        with worker.inner.fenced(slow.ref, TTL_MS) as tx:
            slow.note_extended_at(sent)
            run.began, run.began_db_ms, run.extended_to_ms = (
                time.monotonic(), tx.now_ms, tx.expires_at_ms
            )
            tx.insert_effect(EffectRecord(f"{slow.ref.scope}:slow", slow.ref.scope, "slow", 1,
                                          slow.ref.token, 0))
            in_transaction.set()
            time.sleep(LONG_SECONDS)  # the user's slow effect: real time, on purpose
            run.db_now_at_commit_ms = tx.read_now_ms()
        run.committed = time.monotonic()
        finished.set()

    thread = threading.Thread(target=slow_effect, name="slow-effect", daemon=True)
    try:
        for handle in handles:
            renewer.track(handle)
        thread.start()
        assert in_transaction.wait(10), "the slow fenced transaction never began"
        while thread.is_alive() and time.monotonic() - run.began < LONG_SECONDS + 15:
            states = {}
            for ref in run.others:
                state = observer.read_lease(ref.scope)
                assert state is not None
                states[ref] = (state.expires_at_ms, state.live)
            run.samples.append((time.monotonic(), states))
            time.sleep(SAMPLE_SECONDS)
        thread.join(30)
        assert finished.is_set(), "the slow fenced transaction failed or never finished"
        # After the commit the renewer renews the slow lease too, within one round.
        wait_until(
            lambda: bool(run.after_commit()),
            timeout=INTERVAL_SECONDS + 3,
            message="a renewal of the slow lease after its commit",
        )
    finally:
        renewer.stop()
        thread.join(30)
    run.lost_handles = sum(handle.lost_reason is not None for handle in handles)
    state = observer.read_lease(slow.ref.scope)
    run.slow_live_after = bool(state and state.live and state.token == slow.ref.token)
    return run


def test_a_ten_second_fenced_transaction_fences_no_other_execution(
    store_factory: StoreFactory, store_backend: str
) -> None:
    run = run_slow_effect(store_factory)
    story = run.timeline()
    # Every other lease stayed live the whole time, as other processes see it.
    assert run.samples, "nothing was observed during the slow transaction"
    assert not run.dead_samples(), f"leases not live: {run.dead_samples()}\n{story}"
    # Nothing was ever lost; the slow lease outlived its transaction by its own extension.
    assert not run.lost(), f"renewals reported leases lost: {run.lost()}\n{story}"
    assert run.lost_handles == 0
    assert run.extended_to_ms == run.began_db_ms + TTL_MS
    assert run.extended_to_ms > run.db_now_at_commit_ms, "the slow lease expired mid-effect"
    assert run.slow_live_after
    assert run.after_commit()[0].outcomes[run.slow] is RenewOutcome.RENEWED, story

    during = run.during()
    assert during, f"the renewer sent no round during the slow effect\n{story}"
    if store_backend == "postgresql":
        # Skipped, not waited for: BUSY for the locked row, and every round returns at once.
        assert all(r.outcomes.get(run.slow) is RenewOutcome.BUSY for r in during), story
        assert all(r.finished - r.started < 1.0 for r in during), story
        for ref in run.others:
            assert all(r.outcomes.get(ref) is RenewOutcome.RENEWED for r in during), story
            gap = run.longest_gap(ref)
            assert gap <= INTERVAL_SECONDS + 1.5, f"{ref.scope} stood still {gap:.1f}s\n{story}"
    else:
        # One writer: a round sent during the effect waited for its commit, then renewed all.
        assert all(r.finished >= run.committed - 0.05 for r in during), story
        waited = during[-1]
        assert all(o is RenewOutcome.RENEWED for o in waited.outcomes.values()), story
        assert waited.finished - run.committed < 1.0, story


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_renewer_that_waits_for_the_locked_row_leaves_every_other_lease_unrenewed(
    store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sabotage twin (PostgreSQL): with ``SKIP LOCKED`` removed from the renewal statement,
    the renewer's round sits behind the slow transaction's row lock, and no other lease
    of the process is renewed until the slow effect commits. (SQLite has one writer: its
    renewals always wait, which the guarantee test allows for.)"""
    with_for_update = Select.with_for_update

    def waiting_for_locks(self: Select[Any], **_: Any) -> Select[Any]:
        return with_for_update(self)  # FOR UPDATE, without SKIP LOCKED

    monkeypatch.setattr(Select, "with_for_update", waiting_for_locks)
    run = run_slow_effect(store_factory)
    story = run.timeline()
    blocked = [r for r in run.during() if r.finished - r.started > 2.0]
    assert blocked, f"no renewal round was held up by the locked row\n{story}"
    assert all(run.longest_gap(ref) > INTERVAL_SECONDS + 1.5 for ref in run.others), story
