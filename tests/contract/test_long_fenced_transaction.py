"""A 10-second fenced effect (design: lock bound) fences no other execution, on both stores.

Two worker processes (two stores, each with its own ``LeaseRenewer``) hold leases; one
execution of the first runs a fenced effect whose ``fn`` takes 10 real seconds. An
observer (a third store, another process's view) samples the other leases all along;
a probe renewal round of the second worker is sent just after the effect began; once
the effect is over a rival tries to take every other lease over. The TTL differs per
backend, for the reason each backend's answer differs:

- PostgreSQL, TTL 18 s (renewals every 6 s): the fenced transaction locks only its own
  lease row, and the renewer's one statement skips it (``SKIP LOCKED``: ``BUSY``) and
  renews the others at once. Every round sent during the effect must return at once,
  and no other lease may go longer than one renewal interval (+1.5 s) without moving. A
  renewer that waited for the row lock would sit 4 s in its round and leave a 10 s
  gap (the PostgreSQL twin). The slow lease is extended by its own transaction (to its
  start + TTL) and renewed by the first round after its commit, up to 11.5 s in: the
  TTL must exceed that (a BUSY round does not extend it), so not 12 s. The effect
  commits.
- SQLite, TTL 9 s (renewals every 3 s, well below the effect's 10 s): one writer for
  the whole database. The watchdog rolls the fenced transaction back once it has held
  the write lock for ttl/4 = 2.25 s; a renewal queued behind it (the probe) goes
  through then, so no other lease goes longer than an interval plus that bound
  without moving, and none is lost. The slow effect is refused with
  ``StoreLockTimeoutError`` and leaves nothing behind: neither its ``fn``'s own write
  nor the effect's record; run again with a quick ``fn``, the same key applies once.
- The SQLite twin: without the watchdog every write waits the whole 10 s, longer than
  the 9 s TTL: the other leases lapse (seen by the observer, reported LOST, taken over
  by the rival).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.sql.selectable import Select

from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.fenced_effects import run_fenced_effect
from celery_agboss.core.lease import LeaseHandle, LeaseRenewer, SentAt, acquire
from celery_agboss.core.protections import SQLITE_LONG_TRANSACTION_NOT_INTERRUPTED
from celery_agboss.core.step_identity import Step, step_of
from celery_agboss.core.store_protocol import EFFECT_RECORD, LeaseRef, RenewOutcome
from celery_agboss.errors import StoreLockTimeoutError
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore, sqlite_write_lock_bound_ms
from celery_agboss.store.transactions import SQLFencedTransaction
from celery_agboss.testing import sabotage
from tests.contract.conftest import StoreFactory
from tests.support.processes import wait_until

LONG_SECONDS = 10.0
OTHERS = 3
TTL_MS = {"postgresql": 18_000, "sqlite": 9_000}
SAMPLE_SECONDS = 0.2
EFFECT = "contract.slow-effect"
SETTINGS = EngineSettings(pseudonym_key=b"long-fenced-transaction-test-key")

_metadata = MetaData()
fn_writes = Table(
    "test_slow_effect_writes",
    _metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("execution_id", String(64), nullable=False),
)
"""The slow effect's own write: a table of the test's, not of the store."""


@dataclass(frozen=True)
class Round:
    started: float
    finished: float
    outcomes: dict[LeaseRef, RenewOutcome]


class RecordingStore:
    """A worker's store, recording every renewal round its renewer sends (in ``rounds``,
    which several workers may share)."""

    def __init__(self, inner: SQLAlchemyStore, rounds: list[Round]) -> None:
        self.inner = inner
        self.rounds = rounds
        self._lock = threading.Lock()

    def renew_leases(self, leases: Sequence[LeaseRef], ttl_ms: int) -> dict[LeaseRef, RenewOutcome]:
        started = time.monotonic()
        outcomes = self.inner.renew_leases(leases, ttl_ms)
        with self._lock:
            self.rounds.append(Round(started, time.monotonic(), dict(outcomes)))
        return outcomes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Execution:
    """What a delivery hands ``run_fenced_effect``: its lease, and fenced transactions that
    extend it (the holder's deadline moves with each one)."""

    def __init__(self, store: SQLAlchemyStore, handle: LeaseHandle, ttl_ms: int) -> None:
        self.store = store
        self.handle = handle
        self.ttl_ms = ttl_ms
        self.settings = SETTINGS
        self.execution_id = handle.ref.scope
        self.on_begin: Callable[[SQLFencedTransaction], None] = lambda tx: None
        self.before_commit: Callable[[SQLFencedTransaction], None] = lambda tx: None

    @property
    def lease_ref(self) -> LeaseRef:
        return self.handle.ref

    @contextmanager
    def fenced(
        self, *, engine_only: bool = False, users_writes: bool = False
    ) -> Iterator[SQLFencedTransaction]:
        sent = SentAt.now(self.handle.clock)
        with self.store.fenced(
            self.handle.ref, self.ttl_ms, engine_only=engine_only, users_writes=users_writes
        ) as tx:
            self.handle.note_extended_at(sent)
            self.on_begin(tx)
            yield tx
            self.before_commit(tx)

    def check_cancel(self, tx: SQLFencedTransaction) -> None:
        """Nobody cancels this execution."""

    def key(self) -> str:
        return self.step().key

    def step(self) -> Step:
        return step_of(EFFECT_RECORD, SETTINGS.tenant, self.execution_id, EFFECT, None, 1)


@dataclass
class SlowEffectRun:
    """What happened around one slow fenced effect (times on the monotonic clock)."""

    backend: str
    ttl_ms: int
    slow: LeaseRef
    others: list[LeaseRef]
    rounds: list[Round]
    began: float = 0.0
    ended: float = 0.0
    began_db_ms: int = 0
    extended_to_ms: int = 0
    db_now_at_commit_ms: int | None = None
    error: BaseException | None = None
    result: Any = None
    probe: Round | None = None
    lost_handles: int = 0
    taken_over: list[str] = field(default_factory=list)
    samples: list[tuple[float, dict[LeaseRef, tuple[int, bool]]]] = field(default_factory=list)
    slow_live_after: bool = False
    slow_writes_after: int = 0
    slow_record_after: bool = False

    @property
    def interval(self) -> float:
        return self.ttl_ms / 3000

    @property
    def bound(self) -> float:
        """How long a SQLite fenced transaction may hold the write lock."""
        return sqlite_write_lock_bound_ms(self.ttl_ms) / 1000

    def during(self) -> list[Round]:
        """Renewal rounds sent while the slow transaction was open."""
        return [r for r in self.rounds if self.began <= r.started < self.ended]

    def after_end(self) -> list[Round]:
        return [r for r in self.rounds if r.finished >= self.ended and self.slow in r.outcomes]

    def lost(self) -> list[LeaseRef]:
        return [ref for r in self.rounds for ref, o in r.outcomes.items() if o is RenewOutcome.LOST]

    def dead_samples(self) -> list[tuple[float, str]]:
        return [
            (round(at - self.began, 2), ref.scope)
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
        edges = [self.began, *moves, self.ended]
        return max(later - earlier for earlier, later in itertools.pairwise(edges))

    def timeline(self) -> str:
        lines = [
            f"{self.backend}: effect began 0.00s, ended {self.ended - self.began:.2f}s "
            f"({type(self.error).__name__ if self.error else 'committed'})"
        ]
        if self.probe is not None:
            lines.append(
                f"probe {self.probe.started - self.began:.2f}s.."
                f"{self.probe.finished - self.began:.2f}s: "
                f"{sorted({o.value for o in self.probe.outcomes.values()})}"
            )
        lines += [
            f"round {r.started - self.began:.2f}s..{r.finished - self.began:.2f}s: "
            f"slow={r.outcomes.get(self.slow)} "
            f"others={sorted({o.value for ref, o in r.outcomes.items() if ref != self.slow})}"
            for r in self.rounds
        ]
        return "\n".join(lines)


def _acquire(store: SQLAlchemyStore, ttl_ms: int) -> LeaseHandle:
    handle = acquire(store, f"long:{uuid.uuid4().hex}", ttl_ms=ttl_ms)
    assert handle is not None
    return handle


def _count_writes(store: SQLAlchemyStore, execution_id: str) -> int:
    with store.engine.connect() as conn:
        count = conn.execute(
            select(func.count()).where(fn_writes.c.execution_id == execution_id)
        ).scalar_one()
    return int(count)


def run_slow_effect(store_factory: StoreFactory, backend: str) -> SlowEffectRun:
    """Worker A's renewer tracks OTHERS + 1 leases, worker B's OTHERS more; one of A's
    executions runs a fenced effect whose fn writes a row and takes LONG_SECONDS."""
    ttl_ms = TTL_MS[backend]
    rounds: list[Round] = []  # appended to by both workers' threads (list.append is atomic)
    worker_a = RecordingStore(store_factory(), rounds)
    worker_b = RecordingStore(store_factory(), rounds)
    observer = store_factory()
    _metadata.create_all(observer.engine)
    renewer_a = LeaseRenewer(worker_a)  # type: ignore[arg-type]
    renewer_b = LeaseRenewer(worker_b)  # type: ignore[arg-type]
    handles_a = [_acquire(worker_a.inner, ttl_ms) for _ in range(OTHERS + 1)]
    handles_b = [_acquire(worker_b.inner, ttl_ms) for _ in range(OTHERS)]
    slow = handles_a[0]
    others = handles_a[1:] + handles_b
    run = SlowEffectRun(backend, ttl_ms, slow.ref, [h.ref for h in others], rounds)
    execution = Execution(worker_a.inner, slow, ttl_ms)
    _watch_the_transaction(run, execution)
    in_effect = threading.Event()
    thread = _slow_effect_thread(run, execution, in_effect)
    prober = _probe_thread(run, renewer_b)
    try:
        for handle in handles_a:
            renewer_a.track(handle)
        for handle in handles_b:
            renewer_b.track(handle)
        thread.start()
        assert in_effect.wait(10), f"the slow fenced effect never began: {run.error!r}"
        prober.start()
        _sample_others(run, observer, thread)
        thread.join(30)
        prober.join(30)
        assert not thread.is_alive(), "the slow fenced effect never finished"
        assert run.probe is not None, "the probe renewal never returned"
        # Whatever became of the effect, the renewer renews the slow lease within a round.
        wait_until(
            lambda: bool(run.after_end()),
            timeout=run.interval + 3,
            message="a renewal of the slow lease after its effect",
        )
        rival = uuid.uuid4().hex
        run.taken_over = [
            ref.scope for ref in run.others if observer.acquire_lease(ref.scope, rival, ttl_ms)
        ]
    finally:
        renewer_a.stop()
        renewer_b.stop()
        thread.join(30)
        if prober.ident is not None:
            prober.join(30)
    run.rounds = sorted(rounds, key=lambda r: r.started)
    run.lost_handles = sum(handle.lost_reason is not None for handle in [slow, *others])
    _take_stock(run, observer, execution)
    return run


def _watch_the_transaction(run: SlowEffectRun, execution: Execution) -> None:
    """Note when the fenced transaction began, what it extended the slow lease to, and
    the database's clock at its commit."""

    def on_begin(tx: SQLFencedTransaction) -> None:
        run.began = time.monotonic()
        run.began_db_ms, run.extended_to_ms = tx.now_ms, tx.expires_at_ms

    def before_commit(tx: SQLFencedTransaction) -> None:
        run.db_now_at_commit_ms = tx.read_now_ms()

    execution.on_begin, execution.before_commit = on_begin, before_commit


def _slow_effect_thread(
    run: SlowEffectRun, execution: Execution, in_effect: threading.Event
) -> threading.Thread:
    """The user's slow effect, to start: ``in_effect`` is set once its fn has written."""

    def slow_fn(conn: Any) -> dict[str, bool]:
        conn.execute(insert(fn_writes).values(execution_id=execution.execution_id))
        in_effect.set()
        time.sleep(LONG_SECONDS)  # the user's slow effect: real time, on purpose
        return {"applied": True}

    def slow_effect() -> None:
        try:
            run.result = run_fenced_effect(execution, execution.step(), slow_fn)
        except BaseException as exc:  # judged by the test
            run.error = exc
        finally:
            run.ended = time.monotonic()

    return threading.Thread(target=slow_effect, name="slow-effect", daemon=True)


def _probe_thread(run: SlowEffectRun, renewer_b: LeaseRenewer) -> threading.Thread:
    def probe() -> None:
        """Worker B renews its leases while the effect holds whatever it holds."""
        started = time.monotonic()
        outcomes = renewer_b.renew_now()
        run.probe = Round(started, time.monotonic(), outcomes)

    return threading.Thread(target=probe, name="probe-renewal", daemon=True)


def _sample_others(run: SlowEffectRun, observer: SQLAlchemyStore, thread: threading.Thread) -> None:
    """The other leases as another process sees them, every SAMPLE_SECONDS of the effect."""
    deadline = run.began + LONG_SECONDS + 15
    while thread.is_alive() and time.monotonic() < deadline:
        states = {}
        for ref in run.others:
            state = observer.read_lease(ref.scope)
            assert state is not None
            states[ref] = (state.expires_at_ms, state.live)
        run.samples.append((time.monotonic(), states))
        time.sleep(SAMPLE_SECONDS)


def _take_stock(run: SlowEffectRun, observer: SQLAlchemyStore, execution: Execution) -> None:
    """What is left once both renewers stopped: the slow lease, its fn's write, its record."""
    state = observer.read_lease(run.slow.scope)
    run.slow_live_after = bool(state and state.live and state.token == run.slow.token)
    run.slow_writes_after = _count_writes(observer, execution.execution_id)
    run.slow_record_after = observer.read_effect(execution.key()) is not None


def test_a_ten_second_fenced_effect_fences_no_other_execution(
    store_factory: StoreFactory, store_backend: str
) -> None:
    run = run_slow_effect(store_factory, store_backend)
    story = run.timeline()
    # Every other lease stayed live the whole time, as other processes see it.
    assert run.samples, "nothing was observed during the slow effect"
    assert not run.dead_samples(), f"leases not live: {run.dead_samples()}\n{story}"
    # Nothing was ever lost, and nobody could take anything over afterwards.
    assert not run.lost(), f"renewals reported leases lost: {run.lost()}\n{story}"
    assert run.lost_handles == 0, story
    assert run.taken_over == [], story
    assert run.slow_live_after, story
    assert run.extended_to_ms == run.began_db_ms + run.ttl_ms
    assert run.probe is not None
    assert all(o is RenewOutcome.RENEWED for o in run.probe.outcomes.values()), story
    assert len(run.probe.outcomes) == OTHERS, story

    if store_backend == "postgresql":
        # The effect committed, its lease outlived it by its own extension.
        assert run.error is None, f"{run.error!r}\n{story}"
        assert run.result == {"applied": True}
        assert run.db_now_at_commit_ms is not None
        assert run.extended_to_ms > run.db_now_at_commit_ms, "the slow lease expired mid-effect"
        assert run.after_end()[0].outcomes[run.slow] is RenewOutcome.RENEWED, story
        # Skipped, not waited for: BUSY for the locked row, and every round returns at once.
        during = run.during()
        of_slow = [r for r in during if run.slow in r.outcomes]
        assert of_slow, f"worker A sent no round during the slow effect\n{story}"
        assert all(r.outcomes[run.slow] is RenewOutcome.BUSY for r in of_slow), story
        assert all(r.finished - r.started < 1.0 for r in during), story
        assert run.probe.finished - run.probe.started < 1.0, story
        for ref in run.others:
            renewals = [r.outcomes[ref] for r in during if ref in r.outcomes]
            assert renewals, f"{ref.scope} was not renewed during the effect\n{story}"
            assert all(o is RenewOutcome.RENEWED for o in renewals), story
            gap = run.longest_gap(ref)
            assert gap <= run.interval + 1.5, f"{ref.scope} stood still {gap:.1f}s\n{story}"
        assert (run.slow_writes_after, run.slow_record_after) == (1, True)
    else:
        # Rolled back once it had held the write lock for the bound, and refused.
        assert isinstance(run.error, StoreLockTimeoutError), f"{run.error!r}\n{story}"
        message = str(run.error)
        assert f"more than {sqlite_write_lock_bound_ms(run.ttl_ms)} ms" in message
        assert "rolled back" in message and "fn short" in message
        assert run.db_now_at_commit_ms is None, "the slow transaction reached its commit"
        # The probe had queued behind the lock and went through when the watchdog let go.
        waited = run.probe.finished - run.began
        assert waited < run.bound + 1.0, f"the probe waited {waited:.1f}s\n{story}"
        assert all(r.finished - r.started < run.bound + 1.0 for r in run.rounds), story
        for ref in run.others:
            gap = run.longest_gap(ref)
            limit = run.interval + run.bound + 1.0
            assert gap <= limit, f"{ref.scope} stood still {gap:.1f}s\n{story}"
        # Nothing of the slow effect is left: neither fn's write nor the effect's record.
        assert (run.slow_writes_after, run.slow_record_after) == (0, False), story


def test_a_refused_slow_effect_applies_once_when_run_again_quickly(
    store_factory: StoreFactory, store_backend: str
) -> None:
    """The retry after ``StoreLockTimeoutError`` (SQLite) finds nothing recorded, applies
    once and is replayed after that; on PostgreSQL a slow effect committed the first time."""
    ttl_ms = 2_000  # a bound of 500 ms: a slow effect of 1 s is refused on SQLite
    store = store_factory()
    _metadata.create_all(store.engine)
    execution = Execution(store, _acquire(store, ttl_ms), ttl_ms)
    bound = sqlite_write_lock_bound_ms(ttl_ms) / 1000
    calls: list[str] = []

    def fn(seconds: float) -> Callable[[Any], dict[str, bool]]:
        def effect(conn: Any) -> dict[str, bool]:
            calls.append(f"{seconds}s")
            conn.execute(insert(fn_writes).values(execution_id=execution.execution_id))
            time.sleep(seconds)  # the effect's own duration
            return {"applied": True}

        return effect

    slow_seconds = bound + 0.5
    if store_backend == "sqlite":
        with pytest.raises(StoreLockTimeoutError):
            run_fenced_effect(execution, execution.step(), fn(slow_seconds))
        assert _count_writes(store, execution.execution_id) == 0
        assert store.read_effect(execution.key()) is None
    else:
        assert run_fenced_effect(execution, execution.step(), fn(slow_seconds)) == {"applied": True}
    assert run_fenced_effect(execution, execution.step(), fn(0)) == {"applied": True}
    assert run_fenced_effect(execution, execution.step(), fn(0)) == {"applied": True}
    expected = [f"{slow_seconds}s"] if store_backend == "postgresql" else [f"{slow_seconds}s", "0s"]
    assert calls == expected
    assert _count_writes(store, execution.execution_id) == 1
    assert store.read_effect(execution.key()) is not None


@pytest.mark.sqlite
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_without_the_watchdog_a_slow_sqlite_effect_lets_other_leases_lapse(
    store_factory: StoreFactory,
) -> None:
    """Sabotage twin (SQLite): a fenced transaction may hold the single write lock for the
    whole 10 s effect. Every renewal waits behind it, longer than the 9 s TTL: other
    executions' leases lapse, are reported LOST, and a rival takes them over."""
    with sabotage(SQLITE_LONG_TRANSACTION_NOT_INTERRUPTED):
        run = run_slow_effect(store_factory, "sqlite")
    story = run.timeline()
    assert run.probe is not None
    assert run.probe.finished - run.began > LONG_SECONDS - 1.0, story  # waited it out
    assert not isinstance(run.error, StoreLockTimeoutError), story
    assert run.dead_samples(), f"no lease was ever seen lapsed\n{story}"
    assert run.lost(), f"no renewal found a lease lost\n{story}"
    assert run.lost_handles > 0, story
    assert run.taken_over, f"the rival took no lease over\n{story}"


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_renewer_that_waits_for_the_locked_row_leaves_every_other_lease_unrenewed(
    store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sabotage twin (PostgreSQL): with ``SKIP LOCKED`` removed from the renewal statement,
    worker A's round sits behind the slow transaction's row lock, and none of its other
    leases is renewed until the slow effect commits."""
    with_for_update = Select.with_for_update

    def waiting_for_locks(self: Select[Any], **_: Any) -> Select[Any]:
        return with_for_update(self)  # FOR UPDATE, without SKIP LOCKED

    monkeypatch.setattr(Select, "with_for_update", waiting_for_locks)
    run = run_slow_effect(store_factory, "postgresql")
    story = run.timeline()
    blocked = [r for r in run.during() if r.finished - r.started > 2.0]
    assert blocked, f"no renewal round was held up by the locked row\n{story}"
    same_worker = run.others[:OTHERS]
    assert all(run.longest_gap(ref) > run.interval + 1.5 for ref in same_worker), story
