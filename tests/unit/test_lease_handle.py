"""The holder's view of its lease: deadlines on two clocks, the margin, loss, renewals.

These prove the holder side of P1 (one owner): a holder past its own deadline, on
either clock, or told by a renewal that its lease is gone, refuses to write or
send — and with ``HOLDER_TRUSTS_LEASE_FOREVER`` switched off it does not (design: PS13).
"""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from collections.abc import Sequence

import pytest

from celery_agboss.core import sabotage
from celery_agboss.core.lease import LeaseHandle, LeaseRenewer, SentAt, acquire
from celery_agboss.core.protections import HOLDER_TRUSTS_LEASE_FOREVER
from celery_agboss.core.store_protocol import LeaseGrant, LeaseRef, RenewOutcome
from celery_agboss.errors import ExecutionFencedError, StoreUnavailableError

REF = LeaseRef("exec-1", "holder-a", 1)
TTL_MS = 30_000


class ManualClock:
    """A holder clock the test moves by hand: both clocks, or the wall clock alone."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall_time = 1_700_000_000.0

    def monotonic(self) -> float:
        return self.mono

    def wall(self) -> float:
        return self.wall_time

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall_time += seconds


def _handle(clock: ManualClock, ttl_ms: int = TTL_MS) -> LeaseHandle:
    return LeaseHandle(REF, ttl_ms, SentAt.now(clock), clock=clock)


def test_a_holder_trusts_its_lease_until_the_ttl_minus_the_margin() -> None:
    clock = ManualClock()
    handle = _handle(clock)
    clock.advance(28.9)
    handle.assert_held()
    assert handle.is_trusted()
    clock.advance(0.2)  # 29.1 s: inside the last second of the TTL
    assert not handle.is_trusted()
    with pytest.raises(ExecutionFencedError) as caught:
        handle.assert_held()
    assert caught.value.scope == "exec-1"  # type: ignore[attr-defined]


def test_a_wall_clock_stepped_forward_ends_the_trust_though_monotonic_time_did_not_move() -> None:
    clock = ManualClock()
    handle = _handle(clock)
    clock.wall_time += 60
    assert not handle.is_trusted()


def test_a_wall_clock_stepped_back_does_not_extend_the_trust() -> None:
    clock = ManualClock()
    handle = _handle(clock)
    clock.wall_time -= 3600
    clock.mono += 29.5
    assert not handle.is_trusted()


def test_the_deadline_counts_from_when_the_renewal_was_sent_not_answered() -> None:
    clock = ManualClock()
    handle = _handle(clock)
    clock.advance(10)
    sent = SentAt.now(clock)
    clock.advance(5)  # the renewal took 5 s to come back
    handle.note_extended_at(sent)
    assert handle.seconds_left() == pytest.approx(30 - 1 - 5)


def test_an_older_extension_answered_late_never_moves_the_deadline_back() -> None:
    clock = ManualClock()
    handle = _handle(clock)
    early = SentAt.now(clock)
    clock.advance(10)
    handle.note_extended_at(SentAt.now(clock))
    handle.note_extended_at(early)
    assert handle.seconds_left() == pytest.approx(29)


def test_a_lease_found_lost_stays_lost_even_when_an_extension_arrives() -> None:
    clock = ManualClock()
    handle = _handle(clock)
    handle.mark_lost("taken over")
    handle.note_extended_at(SentAt.now(clock))
    assert not handle.is_trusted()
    with pytest.raises(ExecutionFencedError, match="taken over"):
        handle.assert_held()


def test_with_the_protection_off_a_holder_trusts_its_lease_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGBOSS_ALLOW_SABOTAGE", "1")
    clock = ManualClock()
    handle = _handle(clock)
    handle.mark_lost()
    clock.advance(3600)
    with sabotage.switched_off(HOLDER_TRUSTS_LEASE_FOREVER):
        handle.assert_held()  # the harm: a zombie that would still write and send
    assert not handle.is_trusted()


# --- acquire and the renewer, against a fake store ---------------------------------------


class FakeStore:
    """Only the lease verbs the holder side calls; answers scripted by the test."""

    clock_offset_source = None

    def __init__(self) -> None:
        self.answers: dict[LeaseRef, RenewOutcome] = {}
        self.fail = False
        self.calls: list[tuple[list[LeaseRef], int]] = []
        self.called = threading.Event()

    def acquire_lease(self, scope: str, holder: str, ttl_ms: int) -> LeaseGrant | None:
        return LeaseGrant(LeaseRef(scope, holder, 1), 0, 0, took_over=False)

    def renew_leases(self, leases: Sequence[LeaseRef], ttl_ms: int) -> dict[LeaseRef, RenewOutcome]:
        self.calls.append((list(leases), ttl_ms))
        self.called.set()
        if self.fail:
            raise StoreUnavailableError()
        return {ref: self.answers.get(ref, RenewOutcome.RENEWED) for ref in leases}


def test_every_acquire_mints_a_new_holder() -> None:
    store = FakeStore()
    first = acquire(store, "exec-1", ttl_ms=TTL_MS)  # type: ignore[arg-type]
    second = acquire(store, "exec-1", ttl_ms=TTL_MS)  # type: ignore[arg-type]
    assert first is not None and second is not None
    assert first.ref.holder != second.ref.holder


def test_a_renewal_moves_renewed_deadlines_marks_lost_ones_and_leaves_busy_ones() -> None:
    clock = ManualClock()
    store = FakeStore()
    renewed = LeaseHandle(LeaseRef("a", "h", 1), TTL_MS, SentAt.now(clock), clock=clock)
    lost = LeaseHandle(LeaseRef("b", "h", 1), TTL_MS, SentAt.now(clock), clock=clock)
    busy = LeaseHandle(LeaseRef("c", "h", 1), TTL_MS, SentAt.now(clock), clock=clock)
    store.answers = {lost.ref: RenewOutcome.LOST, busy.ref: RenewOutcome.BUSY}
    renewer = LeaseRenewer(store)  # type: ignore[arg-type]
    clock.advance(10)
    outcome = renewer.renew_now([renewed, lost, busy])
    assert outcome[renewed.ref] is RenewOutcome.RENEWED
    assert len(store.calls) == 1  # one statement for all of them
    assert renewed.seconds_left() == pytest.approx(29)
    assert busy.seconds_left() == pytest.approx(19)
    assert not lost.is_trusted()


def test_a_failed_renewal_leaves_the_deadline_running_out() -> None:
    clock = ManualClock()
    store = FakeStore()
    store.fail = True
    handle = _handle(clock)
    clock.advance(10)
    LeaseRenewer(store).renew_now([handle])  # type: ignore[arg-type]
    assert handle.seconds_left() == pytest.approx(19)
    assert handle.lost_reason is None


def test_the_background_renewer_renews_a_tracked_lease_after_a_third_of_its_ttl() -> None:
    store = FakeStore()
    handle = LeaseHandle(REF, 300, SentAt.now(time_clock := _RealClock()), clock=time_clock)
    renewer = LeaseRenewer(store)  # type: ignore[arg-type]
    try:
        renewer.track(handle)
        assert store.called.wait(5.0)
        assert store.calls[0] == ([REF], 300)
    finally:
        renewer.stop()


def test_a_busy_lease_is_tried_again_well_before_the_next_regular_round() -> None:
    store = FakeStore()
    store.answers = {REF: RenewOutcome.BUSY}
    ttl_ms = 1_200  # regular rounds every 0.4 s; a BUSY lease again after 0.1 s
    handle = LeaseHandle(REF, ttl_ms, SentAt.now(_RealClock()))
    renewer = LeaseRenewer(store)  # type: ignore[arg-type]
    try:
        renewer.track(handle)
        deadline = time.monotonic() + 5.0
        while len(store.calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(store.calls) >= 3
        started = time.monotonic()
        before = len(store.calls)
        while len(store.calls) == before and time.monotonic() < deadline:
            time.sleep(0.005)
        assert time.monotonic() - started < 0.3  # not the regular 0.4 s
        assert handle.lost_reason is None
    finally:
        renewer.stop()


class _RealClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_renews_none_of_its_parents_leases() -> None:
    store = FakeStore()
    renewer = LeaseRenewer.for_store(store)  # type: ignore[arg-type]
    handle = LeaseHandle(REF, 60_000, SentAt.now(_RealClock()))
    try:
        renewer.track(handle)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what it would renew, then leave at once
            try:
                child = LeaseRenewer.for_store(store)  # type: ignore[arg-type]
                os.write(write_end, f"{len(child.tracked())},{child is renewer}".encode())
            finally:
                os._exit(0)
        os.close(write_end)
        answer = os.read(read_end, 100).decode()
        os.waitpid(pid, 0)
        os.close(read_end)
        assert answer == "0,False"
        assert renewer.tracked() == [handle]
    finally:
        renewer.stop()


def test_a_stopped_renewer_lets_its_store_go() -> None:
    """A process that opens and closes stores (tests, the CLI, a Django shell) must not
    keep every closed store and its engine alive through the one-renewer registry."""
    store = FakeStore()
    renewer = LeaseRenewer.for_store(store)  # type: ignore[arg-type]
    assert LeaseRenewer.for_store(store) is renewer  # type: ignore[arg-type]
    renewer.stop()
    assert LeaseRenewer.for_store(store) is not renewer  # type: ignore[arg-type]
    LeaseRenewer.for_store(store).stop()  # type: ignore[arg-type]
    gone = weakref.ref(store)
    del store, renewer
    gc.collect()
    assert gone() is None
