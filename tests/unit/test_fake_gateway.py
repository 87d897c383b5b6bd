"""FakeGateway and the clocks: what a user's payment test can rely on (G1–G5, faults, holds)."""

from __future__ import annotations

import dataclasses
import pickle
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from celery_agboss.core.holder_clocks import HolderClock
from celery_agboss.testing import (
    FakeGateway,
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayFault,
    FakeGatewayTimeout,
    GatewayCapabilities,
    GatewayRequestOutcome,
    SkewedHolderClock,
    VirtualClock,
    is_definite_failure,
)
from tests.support.processes import in_a_thread

THREADS = 16
JOIN_SECONDS = 10.0


def _with(**switches: object) -> GatewayCapabilities:
    return dataclasses.replace(GatewayCapabilities.FULL, **switches)  # type: ignore[arg-type]


# --- the clocks ------------------------------------------------------------------------


def test_a_virtual_clock_is_real_time_plus_what_the_test_advanced() -> None:
    clock = VirtualClock()
    before = time.time()
    clock.advance(timedelta(hours=1))
    clock.advance(30)
    assert clock.offset_seconds == pytest.approx(3630)
    assert clock.offset_ms() == 3_630_000
    assert clock.now() - before == pytest.approx(3630, abs=1)


def test_a_virtual_clock_never_moves_backwards() -> None:
    clock = VirtualClock()
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1)
    assert clock.offset_seconds == 0


def test_a_virtual_clock_can_start_at_a_chosen_time() -> None:
    clock = VirtualClock(start=1_000_000.0)
    assert clock.now() == pytest.approx(1_000_000.0, abs=1)


def test_attaching_a_virtual_clock_gives_the_store_its_offset() -> None:
    class Target:
        clock_offset_source: Callable[[], int] | None = None

    target = Target()
    clock = VirtualClock()
    clock.attach(target)
    clock.advance(2.5)
    source = target.clock_offset_source
    assert source is not None and source() == 2500


def test_a_skewed_holder_clock_is_off_by_its_skews_and_steps_its_wall_clock_only() -> None:
    clock: HolderClock = SkewedHolderClock(wall_skew=10.0, mono_skew=-5.0)
    assert clock.wall() - time.time() == pytest.approx(10.0, abs=0.5)
    assert clock.monotonic() - time.monotonic() == pytest.approx(-5.0, abs=0.5)
    assert isinstance(clock, SkewedHolderClock)
    clock.step_wall(-60)  # NTP steps it back, mid-lease
    assert clock.wall() - time.time() == pytest.approx(-50.0, abs=0.5)
    assert clock.monotonic() - time.monotonic() == pytest.approx(-5.0, abs=0.5)
    clock.advance(3)  # a pause both clocks saw
    assert (clock.wall_skew, clock.mono_skew) == (-47.0, -2.0)
    with pytest.raises(ValueError):
        clock.advance(-1)


# --- what a repeat under one key gets (design: G1, G4, G5) ---------------------------------


def test_two_charges_under_one_key_make_one_payment_and_two_requests() -> None:
    gateway = FakeGateway()
    first = gateway.charge(1000, "order-1")
    second = gateway.charge(1000, "order-1")
    assert second == first
    assert [p["id"] for p in gateway.payments] == [first["id"]]
    assert [(r.attempt, r.outcome) for r in gateway.requests_for("order-1")] == [
        (1, GatewayRequestOutcome.PROCESSED),
        (2, GatewayRequestOutcome.REPLAYED),
    ]


def test_a_receipt_names_the_payment_and_what_was_asked() -> None:
    clock = VirtualClock()
    receipt = FakeGateway(clock).charge(1250, "k-1", currency="eur", reference="order-7", note="x")
    assert receipt["id"].startswith("ch_")
    assert receipt["status"] == "succeeded"
    assert (receipt["amount"], receipt["currency"]) == (1250, "eur")
    assert (receipt["idempotency_key"], receipt["reference"]) == ("k-1", "order-7")
    assert receipt["metadata"] == {"note": "x"}
    assert receipt["created"] == pytest.approx(clock.now(), abs=1)


def test_receipts_are_copies_that_a_caller_cannot_change_inside_the_gateway() -> None:
    gateway = FakeGateway()
    gateway.charge(1000, "k")["amount"] = 1
    assert gateway.charge(1000, "k")["amount"] == 1000
    assert gateway.payments[0]["amount"] == 1000


def test_without_first_response_on_repeat_the_repeat_names_the_payment_with_another_body() -> None:
    gateway = FakeGateway(capabilities=_with(first_response_on_repeat=False))
    first = gateway.charge(1000, "k")
    second = gateway.charge(1000, "k")
    assert second["id"] == first["id"]
    assert second != first
    assert second["request_id"] != first["request_id"]
    assert len(gateway.payments) == 1


def test_a_repeat_with_another_amount_is_refused_as_a_conflict() -> None:
    gateway = FakeGateway()
    gateway.charge(1000, "k")
    with pytest.raises(FakeGatewayError) as raised:
        gateway.charge(2000, "k")
    assert raised.value.kind is FakeGatewayErrorKind.CONFLICT
    assert not is_definite_failure(raised.value)
    assert len(gateway.payments) == 1
    assert gateway.requests[-1].outcome is GatewayRequestOutcome.CONFLICT


def test_without_conflict_on_mismatch_a_changed_repeat_gets_the_first_payment() -> None:
    gateway = FakeGateway(capabilities=_with(conflict_on_mismatch=False))
    first = gateway.charge(1000, "k")
    assert gateway.charge(2000, "k") == first
    assert [p["amount"] for p in gateway.payments] == [1000]


def test_without_idempotency_keys_every_charge_is_a_new_payment() -> None:
    gateway = FakeGateway(capabilities=GatewayCapabilities.NO_KEYS)
    first = gateway.charge(1000, "k")
    second = gateway.charge(1000, "k")
    assert first["id"] != second["id"]
    assert len(gateway.payments_for("k")) == 2
    assert [r.attempt for r in gateway.requests_for("k")] == [1, 2]


def test_a_charge_without_any_key_is_never_deduplicated() -> None:
    gateway = FakeGateway()
    gateway.charge(1000, None)
    gateway.charge(1000, None)
    assert len(gateway.payments) == 2


# --- retention on the virtual clock (design: G3) ---------------------------------------


def test_a_key_is_honoured_just_inside_its_retention_and_forgotten_after_it() -> None:
    clock = VirtualClock()
    gateway = FakeGateway(clock, capabilities=_with(key_retention=3600))
    first = gateway.charge(1000, "k")
    clock.advance(3599)
    assert gateway.charge(1000, "k")["id"] == first["id"]
    clock.advance(2)
    late = gateway.charge(1000, "k")
    assert late["id"] != first["id"]
    assert len(gateway.payments_for("k")) == 2  # the late replay charged again (design: PS17)


def test_forget_keys_makes_the_next_repeat_a_new_payment() -> None:
    gateway = FakeGateway()
    gateway.charge(1000, "k")
    gateway.forget_keys()
    gateway.charge(1000, "k")
    assert len(gateway.payments) == 2


# --- lookups (design: G2) --------------------------------------------------------------


def test_lookup_finds_the_payment_a_key_made_whatever_the_keys_age() -> None:
    clock = VirtualClock()
    gateway = FakeGateway(clock)
    receipt = gateway.charge(1000, "k")
    clock.advance(timedelta(days=30))
    found = gateway.lookup("k")
    assert found is not None and found["id"] == receipt["id"]
    assert gateway.lookup("never-sent") is None
    assert [(entry.value, entry.found) for entry in gateway.lookups] == [
        ("k", 1),
        ("never-sent", 0),
    ]


def test_without_lookup_by_key_a_lookup_is_refused() -> None:
    gateway = FakeGateway(capabilities=GatewayCapabilities.NO_LOOKUP)
    gateway.charge(1000, "k")
    with pytest.raises(FakeGatewayError) as raised:
        gateway.lookup("k")
    assert raised.value.kind is FakeGatewayErrorKind.LOOKUP_UNSUPPORTED
    with pytest.raises(FakeGatewayError):
        gateway.lookup_by_reference("order-1")


def test_lookup_by_reference_lists_every_payment_made_with_it() -> None:
    gateway = FakeGateway(capabilities=GatewayCapabilities(idempotency_keys=False))
    gateway.charge(1000, "a", reference="order-1")
    gateway.charge(1000, "b", reference="order-1")
    gateway.charge(1000, "c", reference="order-2")
    assert [p["idempotency_key"] for p in gateway.lookup_by_reference("order-1")] == ["a", "b"]


def test_capabilities_are_attributes_that_a_test_can_switch_mid_test() -> None:
    gateway = FakeGateway()
    assert gateway.capabilities == GatewayCapabilities.FULL
    gateway.lookup_by_key = False
    assert gateway.capabilities.lookup_by_key is False
    with pytest.raises(FakeGatewayError):
        gateway.lookup("k")
    gateway.capabilities = GatewayCapabilities.NO_KEYS
    assert gateway.idempotency_keys is False and gateway.key_retention == 0.0


def test_the_presets_are_the_three_support_levels_of_ps6() -> None:
    full, no_lookup, no_keys = (
        GatewayCapabilities.FULL,
        GatewayCapabilities.NO_LOOKUP,
        GatewayCapabilities.NO_KEYS,
    )
    assert full == GatewayCapabilities()
    assert no_lookup.idempotency_keys and not no_lookup.lookup_by_key
    assert not no_keys.idempotency_keys and not no_keys.lookup_by_key
    with pytest.raises(ValueError):
        GatewayCapabilities(key_retention=-1)


# --- faults ------------------------------------------------------------------------------


def test_answer_then_drop_charges_and_the_caller_sees_a_timeout() -> None:
    gateway = FakeGateway()
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with pytest.raises(FakeGatewayTimeout) as raised:
        gateway.charge(1000, "k")
    assert isinstance(raised.value, TimeoutError)
    assert raised.value.kind is FakeGatewayErrorKind.ANSWER_DROPPED
    assert not is_definite_failure(raised.value)
    assert len(gateway.payments) == 1
    (request,) = gateway.requests
    assert request.outcome is GatewayRequestOutcome.PROCESSED and not request.answered
    assert request.fault is FakeGatewayFault.ANSWER_THEN_DROP
    retry = gateway.charge(1000, "k")  # the same key: the first payment, nothing new
    assert retry["id"] == gateway.payments[0]["id"] and len(gateway.payments) == 1


def test_answer_then_drop_without_keys_turns_a_retry_into_a_second_charge() -> None:
    gateway = FakeGateway(capabilities=GatewayCapabilities.NO_KEYS)
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with pytest.raises(FakeGatewayTimeout):
        gateway.charge(1000, "k")
    gateway.charge(1000, "k")
    assert len(gateway.payments) == 2


def test_fail_before_processing_moves_no_money_and_is_a_definite_failure() -> None:
    gateway = FakeGateway()
    gateway.inject_fault(FakeGatewayFault.FAIL_BEFORE_PROCESSING)
    with pytest.raises(FakeGatewayError) as raised:
        gateway.charge(1000, "k")
    assert raised.value.kind is FakeGatewayErrorKind.NOT_PROCESSED
    assert is_definite_failure(raised.value)
    assert gateway.payments == [] and gateway.lookup("k") is None
    gateway.charge(1000, "k")  # resent under the same key: processed now
    assert len(gateway.payments) == 1
    assert [r.outcome for r in gateway.requests] == [
        GatewayRequestOutcome.NOT_PROCESSED,
        GatewayRequestOutcome.PROCESSED,
    ]


def test_a_decline_is_definite_and_is_not_saved_under_the_key() -> None:
    gateway = FakeGateway()
    gateway.inject_fault(FakeGatewayFault.DECLINE)
    with pytest.raises(FakeGatewayError) as raised:
        gateway.charge(1000, "k")
    assert raised.value.kind is FakeGatewayErrorKind.DECLINED and is_definite_failure(raised.value)
    assert gateway.charge(1000, "k")["status"] == "succeeded"


@pytest.mark.parametrize("kind", list(FakeGatewayErrorKind))
def test_only_not_processed_and_declined_are_definite_failures(kind: FakeGatewayErrorKind) -> None:
    definite = kind in (FakeGatewayErrorKind.NOT_PROCESSED, FakeGatewayErrorKind.DECLINED)
    assert is_definite_failure(FakeGatewayError(kind)) is definite
    assert is_definite_failure(FakeGatewayTimeout()) is False
    assert is_definite_failure(ValueError("declined")) is False


def test_slow_on_a_virtual_clock_advances_the_clock_instead_of_sleeping() -> None:
    clock = VirtualClock()
    gateway = FakeGateway(clock)
    gateway.inject_fault(FakeGatewayFault.SLOW, delay=timedelta(minutes=5))
    started = time.monotonic()
    receipt = gateway.charge(1000, "k")
    assert time.monotonic() - started < 1.0
    assert clock.offset_seconds == pytest.approx(300)
    assert receipt["created"] == pytest.approx(clock.now(), abs=1)


def test_slow_without_a_clock_sleeps_about_its_delay() -> None:
    gateway = FakeGateway()
    gateway.inject_fault(FakeGatewayFault.SLOW, delay=0.05)
    started = time.monotonic()
    gateway.charge(1000, "k")
    assert 0.04 <= time.monotonic() - started < 2.0


def test_slow_needs_a_delay_and_a_fault_needs_a_positive_count() -> None:
    gateway = FakeGateway()
    with pytest.raises(ValueError, match="delay"):
        gateway.inject_fault(FakeGatewayFault.SLOW)
    with pytest.raises(ValueError, match="times"):
        gateway.inject_fault(FakeGatewayFault.DECLINE, times=0)


def test_a_fault_armed_twice_hits_the_next_two_requests_only() -> None:
    gateway = FakeGateway()
    gateway.inject_fault(FakeGatewayFault.FAIL_BEFORE_PROCESSING, times=2)
    for key in ("a", "b"):
        with pytest.raises(FakeGatewayError):
            gateway.charge(1000, key)
    gateway.charge(1000, "c")
    assert [p["idempotency_key"] for p in gateway.payments] == ["c"]


def test_a_fault_for_one_operation_leaves_the_others_alone() -> None:
    gateway = FakeGateway()
    gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="refund")
    payment = gateway.charge(1000, "charge-1")
    with pytest.raises(FakeGatewayTimeout):
        gateway.refund(payment["id"], "refund-1")
    assert len(gateway.refunds) == 1
    assert gateway.refund(payment["id"], "refund-1")["id"] == gateway.refunds[0]["id"]
    assert len(gateway.refunds) == 1


def test_clear_faults_disarms_what_was_injected() -> None:
    gateway = FakeGateway()
    gateway.inject_fault(FakeGatewayFault.DECLINE, times=5)
    gateway.clear_faults()
    gateway.charge(1000, "k")


# --- on the wire: holds ------------------------------------------------------------------


def test_a_held_charge_is_made_but_not_answered_until_released() -> None:
    gateway = FakeGateway()
    with gateway.hold() as hold:
        thread, box = in_a_thread(lambda: gateway.charge(1000, "k"))
        hold.wait_reached(JOIN_SECONDS)
        assert len(gateway.payments) == 1  # the money moved ...
        assert not gateway.requests[0].answered  # ... the answer is still on the wire
        assert "result" not in box
    thread.join(JOIN_SECONDS)
    assert box["result"] == gateway.charge(1000, "k")
    assert gateway.requests[0].answered


def test_a_repeat_while_the_first_answer_is_on_the_wire_gets_the_first_response() -> None:
    gateway = FakeGateway()
    with gateway.hold() as hold:
        thread, _ = in_a_thread(lambda: gateway.charge(1000, "k"))
        hold.wait_reached(JOIN_SECONDS)
        repeat = gateway.charge(1000, "k")
    thread.join(JOIN_SECONDS)
    assert repeat["id"] == gateway.payments[0]["id"] and len(gateway.payments) == 1


def test_a_repeat_while_the_first_is_held_before_processing_is_refused_in_progress() -> None:
    gateway = FakeGateway()
    with gateway.hold(before_processing=True) as hold:
        thread, box = in_a_thread(lambda: gateway.charge(1000, "k"))
        hold.wait_reached(JOIN_SECONDS)
        assert gateway.payments == []
        with pytest.raises(FakeGatewayError) as raised:
            gateway.charge(1000, "k")
        assert raised.value.kind is FakeGatewayErrorKind.IN_PROGRESS
        assert not is_definite_failure(raised.value)
    thread.join(JOIN_SECONDS)
    assert "result" in box and len(gateway.payments) == 1


def test_a_hold_never_released_gives_up_and_the_caller_sees_a_timeout() -> None:
    gateway = FakeGateway()
    gateway.hold(timeout=0.05)
    with pytest.raises(FakeGatewayTimeout) as raised:
        gateway.charge(1000, "k")
    assert raised.value.kind is FakeGatewayErrorKind.ANSWER_DROPPED
    assert len(gateway.payments) == 1


def test_a_hold_before_processing_that_times_out_processed_nothing() -> None:
    gateway = FakeGateway()
    gateway.hold(before_processing=True, timeout=0.05)
    with pytest.raises(FakeGatewayTimeout) as raised:
        gateway.charge(1000, "k")
    assert raised.value.kind is FakeGatewayErrorKind.TIMED_OUT
    assert gateway.payments == []
    gateway.charge(1000, "k")  # the key is no longer in flight


def test_close_releases_every_request_on_the_wire() -> None:
    gateway = FakeGateway()
    hold = gateway.hold(times=2)
    threads = [in_a_thread(lambda key=key: gateway.charge(1000, key)) for key in ("a", "b")]
    hold.wait_reached(JOIN_SECONDS)
    gateway.close()
    for thread, _ in threads:
        thread.join(JOIN_SECONDS)
        assert not thread.is_alive()
    assert all("result" in box for _, box in threads)


def test_waiting_for_a_hold_nobody_reaches_fails_instead_of_hanging() -> None:
    with pytest.raises(AssertionError, match="no request reached"):
        FakeGateway().hold().wait_reached(0.01)


# --- threads -------------------------------------------------------------------------------


def _charge_from_threads(gateway: FakeGateway, key: str) -> list[object]:
    barrier = threading.Barrier(THREADS, timeout=JOIN_SECONDS)
    results: list[object] = []
    lock = threading.Lock()

    def charge() -> None:
        barrier.wait()
        receipt = gateway.charge(1000, key)
        with lock:
            results.append(receipt["id"])

    threads = [threading.Thread(target=charge, daemon=True) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_SECONDS)
    assert not any(thread.is_alive() for thread in threads)
    return results


def test_many_threads_charging_one_key_make_one_payment() -> None:
    gateway = FakeGateway()
    ids = _charge_from_threads(gateway, "k")
    assert len(ids) == THREADS and len(set(ids)) == 1
    assert len(gateway.payments) == 1
    assert sorted(r.attempt for r in gateway.requests_for("k")) == list(range(1, THREADS + 1))


def test_many_threads_without_keys_make_as_many_payments_all_in_requests() -> None:
    gateway = FakeGateway(capabilities=GatewayCapabilities.NO_KEYS)
    ids = _charge_from_threads(gateway, "k")
    assert len(set(ids)) == THREADS
    assert len(gateway.payments) == THREADS
    assert len(gateway.requests_for("k")) == THREADS


# --- capture, void, refund -----------------------------------------------------------------


def test_an_authorisation_is_captured_once_in_part_and_never_over_captured() -> None:
    gateway = FakeGateway()
    auth = gateway.charge(1000, "auth", capture=False)
    assert auth["status"] == "requires_capture" and auth["amount_captured"] == 0
    with pytest.raises(FakeGatewayError) as over:
        gateway.capture(auth["id"], "cap-over", amount=1001)
    assert over.value.kind is FakeGatewayErrorKind.INVALID_REQUEST
    captured = gateway.capture(auth["id"], "cap", amount=600)
    assert captured["amount_captured"] == 600
    assert gateway.capture(auth["id"], "cap", amount=600) == captured  # a keyed repeat
    with pytest.raises(FakeGatewayError):
        gateway.capture(auth["id"], "cap-2")  # already captured
    assert [r.operation for r in gateway.requests] == [
        "charge",
        "capture",
        "capture",
        "capture",
        "capture",
    ]


def test_a_captured_payment_cannot_be_voided_and_a_voided_one_cannot_be_captured() -> None:
    gateway = FakeGateway()
    captured = gateway.charge(1000, "c1")
    with pytest.raises(FakeGatewayError):
        gateway.void(captured["id"], "v1")
    auth = gateway.charge(1000, "c2", capture=False)
    assert gateway.void(auth["id"], "v2")["status"] == "canceled"
    with pytest.raises(FakeGatewayError):
        gateway.capture(auth["id"], "cap")


def test_a_refund_is_keyed_and_never_exceeds_what_was_captured() -> None:
    gateway = FakeGateway()
    payment = gateway.charge(1000, "c")
    first = gateway.refund(payment["id"], "r1", amount=400)
    assert first["id"].startswith("re_") and first["payment"] == payment["id"]
    assert gateway.refund(payment["id"], "r1", amount=400) == first
    with pytest.raises(FakeGatewayError) as too_much:
        gateway.refund(payment["id"], "r2", amount=700)
    assert too_much.value.kind is FakeGatewayErrorKind.INVALID_REQUEST
    gateway.refund(payment["id"], "r3")  # the rest
    assert gateway.retrieve(payment["id"])["status"] == "refunded"
    assert [r["amount"] for r in gateway.refunds] == [400, 600]
    assert [r.operation for r in gateway.requests_for("r1")] == ["refund", "refund"]
    with pytest.raises(FakeGatewayError) as missing:
        gateway.refund("ch_missing", "r4")
    assert missing.value.kind is FakeGatewayErrorKind.NOT_FOUND


# --- errors and the fixture ----------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        FakeGatewayError(FakeGatewayErrorKind.CONFLICT, "key reused"),
        FakeGatewayTimeout(),
        FakeGatewayTimeout(FakeGatewayErrorKind.TIMED_OUT, "held"),
    ],
)
def test_fake_gateway_errors_pickle_with_their_kind(error: FakeGatewayError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (copy.kind, str(copy)) == (error.kind, str(error))


def test_the_fake_gateway_fixture_runs_on_the_agboss_clock(
    fake_gateway: FakeGateway, agboss_clock: VirtualClock
) -> None:
    assert fake_gateway.clock is agboss_clock
    fake_gateway.inject_fault(FakeGatewayFault.SLOW, delay=120)
    fake_gateway.charge(1000, "k")
    assert agboss_clock.offset_seconds == pytest.approx(120)
