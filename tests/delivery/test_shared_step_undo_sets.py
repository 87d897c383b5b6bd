"""Two tasks share one charge (one business key, one request) and declare different undos
after it: ``checkout`` a refund, ``reserve_and_pay`` a stock release that moves no money.
Both fail; ``checkout`` first, so it waits while the other still uses the charge, and the
other claims the step's undo. Before the fix the claim "covered" the refund: release-stock
ran, the step read undone, both ended ``FAILED`` with nobody told, and a later click told
"undone" paid again.

Now a claim covers only the undos its claimer declared too: the refund's execution waits
for a person, naming the step's handle and the claimer, and the step is never read undone
by a later click. Same undos on both: one refund, as before. Both stores, counted at the
fake gateway; twin ``undo-covered-by-other-undos``.

A worker in a thread of this process (tests/delivery/conftest.py). Speed-up: a replay
that meets a claimed step waits 0.05 s, not 5 s, for the claimer's undo to end
(``COMPENSATION_WAIT_S``): every later click here comes after both executions ended, so
no undo is in flight and the wait could only run out.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from celery_agboss import OutboundCallCompensatedError
from celery_agboss.core import state_machine
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.executions import CANCELLED_AFTER_PAYMENT, UNDO_WAITS, ExecutionRecord
from celery_agboss.core.keys import business_key_handle
from celery_agboss.core.protections import UNDO_COVERED_BY_OTHER_UNDOS
from celery_agboss.operator import cancel, list_failed_after_payment, list_waits
from celery_agboss.task import undo_function
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop, assert_waits_for_an_operator
from tests.support.processes import wait_until

GATE_SECONDS = 30
ENDED = ("FAILED", "WAITING_OPERATOR", "CANCELLED")


@pytest.fixture(autouse=True)
def _no_undo_in_flight_at_a_click(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_machine, "COMPENSATION_WAIT_S", 0.05)


class TwoTasks:
    """``checkout`` (``first_undo``) and ``reserve_and_pay`` (``other_undo``) on one charge,
    each held at a gate after its undo_with(), then failing."""

    def __init__(
        self,
        shop: PaymentShop,
        other_undo: str,
        first_undo: str = "refund-charge",
        other_arguments: dict[str, Any] | None = None,
    ) -> None:
        self.shop = shop
        self.ran: list[str] = []
        self.gates = {g: threading.Event() for g in "abc"}
        self.reached = {g: threading.Event() for g in "abc"}
        charge, refund = shop.call(), shop.refund_call()
        ran, gates, reached = self.ran, self.gates, self.reached

        @undo_function(shop.app, "refund-charge")
        def refund_charge(task: Any, undo: UndoStep, payment: str, **_: Any) -> None:
            ran.append("refund-charge")
            task.outbound(refund, {"payment": payment})

        @undo_function(shop.app, "release-stock")
        def release_stock(task: Any, undo: UndoStep, payment: str) -> None:
            ran.append("release-stock")  # the stock goes back on the shelf: no money

        def paying(name: str, gate: str, undo: str, error: str, **more: Any) -> Any:
            def body(self: Any, order: str) -> Any:
                request = {"amount": 1000, "order": order}
                receipt = self.outbound(charge, request, business_key=f"order:{order}")
                self.undo_with(undo, payment=receipt["id"], **more)
                reached[gate].set()
                assert gates[gate].wait(GATE_SECONDS)
                raise LookupError(error)

            body.__name__ = body.__qualname__ = name  # its task's name: shop.<name>
            return shop.task()(body)

        self.checkout = paying("checkout", "a", first_undo, "out of stock")
        self.reserve_and_pay = paying(
            "reserve_and_pay", "b", other_undo, "address invalid", **(other_arguments or {})
        )
        self.checkout_again = paying("checkout_again", "c", first_undo, "card declined")

    def run(self) -> tuple[ExecutionRecord, ExecutionRecord]:
        """checkout fails first and waits for reserve_and_pay, which fails next; both end."""
        shop = self.shop
        with shop.worker(concurrency=2):
            a = str(self.checkout.delay("u-1").id)
            assert self.reached["a"].wait(GATE_SECONDS)
            b = str(self.reserve_and_pay.delay("u-1").id)
            assert self.reached["b"].wait(GATE_SECONDS)
            self.gates["a"].set()
            wait_until(
                lambda: (shop.execution(a).reason or "").startswith(UNDO_WAITS),
                20,
                message="checkout's undo waits for reserve_and_pay",
            )
            self.gates["b"].set()
            shop.wait_state(b, *ENDED, timeout=30)

            def both_ended() -> bool:
                if all(shop.execution(x).state.value in ENDED for x in (a, b)):
                    return True
                shop.clock.advance(shop.agboss.executions.shared_wait_ms / 1000 + 1)
                shop.sweep()  # re-drives checkout's wait
                return False

            wait_until(both_ended, 40, interval=0.3, message="both executions ended")
        return shop.execution(a), shop.execution(b)

    def later_click(self, name: str = "place_order") -> list[bool]:
        """A click after both ended, following docs/undo.md: a new attempt only when the
        first was undone; what it was told (``.undone``). ``name``: its task's, one per
        click of a test."""
        shop, charge = self.shop, self.shop.call()
        told: list[bool] = []

        def place_order(self: Any, order: str) -> Any:
            request = {"amount": 1000, "order": order}
            try:
                return self.outbound(charge, request, business_key=f"order:{order}")
            except OutboundCallCompensatedError as exc:
                told.append(bool(exc.undone))  # type: ignore[attr-defined]
                if not exc.undone:  # type: ignore[attr-defined]
                    raise  # not refunded (yet): never a second charge
                attempt = f"order:{order}:attempt:2"
                return self.outbound(charge, request, business_key=attempt)

        place_order.__name__ = place_order.__qualname__ = name
        shop.run(shop.task()(place_order), "u-1", states=("COMPLETED", *ENDED))
        return told


def _step_handle(shop: PaymentShop, creator: str) -> str:
    """The shared charge's step as a reason may name it (its key holds the order)."""
    (charge,) = shop.intents(creator)
    return business_key_handle(shop.agboss.settings.pseudonym_key, charge.idempotency_key)


def test_a_claim_with_other_undos_leaves_the_refund_to_a_person(shop: PaymentShop) -> None:
    tasks = TwoTasks(shop, "release-stock")
    a, b = tasks.run()
    assert tasks.ran == ["release-stock"]
    assert (len(shop.gateway.payments), len(shop.gateway.refunds)) == (1, 0)
    assert_waits_for_an_operator(a, "UndoNotCoveredError", _step_handle(shop, a.id), b.id)
    assert "u-1" not in (a.reason or ""), "the business key is never in clear"
    assert a.id in [w.execution.id for w in list_waits(shop.app)]
    assert b.state.value == "FAILED"
    # One place tells the person what is owed (the wait): the claimer, its own undos done,
    # is not listed again, or the charge would be refunded twice.
    assert list_failed_after_payment(shop.app) == []
    # The refund made by hand, the person ends the wait.
    ended = cancel(shop.app, a.id, "refunded at the gateway", payments_handled=True)
    assert ended.state.value == "CANCELLED"


def test_twin_the_refund_is_skipped_and_nobody_told(shop: PaymentShop) -> None:
    tasks = TwoTasks(shop, "release-stock")
    with sabotage(UNDO_COVERED_BY_OTHER_UNDOS):
        a, b = tasks.run()
    assert (a.state.value, b.state.value) == ("FAILED", "FAILED")
    assert shop.net_paid() == 1000 and not shop.gateway.refunds  # charged, never refunded
    assert not list_waits(shop.app) and not list_failed_after_payment(shop.app)


def test_a_later_click_is_never_told_undone_and_charged_again(shop: PaymentShop) -> None:
    tasks = TwoTasks(shop, "release-stock")
    tasks.run()
    assert tasks.later_click() == [False]
    assert (len(shop.gateway.payments), len(shop.gateway.refunds)) == (1, 0)


def test_twin_a_later_click_is_told_undone_and_pays_again(shop: PaymentShop) -> None:
    tasks = TwoTasks(shop, "release-stock")
    with sabotage(UNDO_COVERED_BY_OTHER_UNDOS):
        tasks.run()
        assert tasks.later_click() == [True]
    assert len(shop.gateway.payments) == 2 and shop.net_paid() == 2000


def test_the_same_undo_on_both_refunds_once(shop: PaymentShop) -> None:
    tasks = TwoTasks(shop, "refund-charge")
    a, b = tasks.run()
    assert tasks.ran == ["refund-charge"]
    assert (a.state.value, b.state.value) == ("FAILED", "FAILED")
    assert (len(shop.gateway.payments), len(shop.gateway.refunds)) == (1, 1)
    assert shop.net_paid() == 0
    assert tasks.later_click() == [True]  # undone: the new attempt pays once
    assert len(shop.gateway.payments) == 2 and shop.net_paid() == 1000


def test_a_claim_that_refunds_leaves_the_other_undo_to_a_person(shop: PaymentShop) -> None:
    """The other way round: the claimer refunds, the stock release is the one left out. The
    refund is made once; the release waits for a person; the step is still not read undone
    (which undo moves money is not known here: it fails closed)."""
    tasks = TwoTasks(shop, "refund-charge", first_undo="release-stock")
    a, b = tasks.run()
    assert tasks.ran == ["refund-charge"]
    assert (len(shop.gateway.payments), len(shop.gateway.refunds)) == (1, 1)
    assert_waits_for_an_operator(a, "UndoNotCoveredError", _step_handle(shop, a.id), b.id)
    assert b.state.value == "FAILED"
    # The claimer refunded: listed as a payment left behind, its refund would be made twice.
    assert list_failed_after_payment(shop.app) == []
    assert tasks.later_click() == [False]
    assert len(shop.gateway.payments) == 1 and shop.net_paid() == 0


def _refund_by_hand(shop: PaymentShop) -> None:
    """What the waiting execution's reason asks a person to do: refund the charge at the
    gateway (counted there like any refund)."""
    shop.gateway.refund(shop.gateway.payments[0]["id"], "refunded-by-hand")


def test_a_plain_cancel_of_the_wait_goes_to_a_person(shop: PaymentShop) -> None:
    """Before the fix a plain cancel (no ``--payments-handled``) of the refund's wait read
    the claim as covering it: ``CANCELLED``, the charge never refunded, listed nowhere."""
    tasks = TwoTasks(shop, "release-stock")
    a, _ = tasks.run()
    ended = cancel(shop.app, a.id, "customer asked")
    assert_waits_for_an_operator(ended, CANCELLED_AFTER_PAYMENT)
    assert a.id in [w.execution.id for w in list_waits(shop.app)]
    assert (len(shop.gateway.payments), len(shop.gateway.refunds)) == (1, 0)
    # The person refunds and settles it; a later click is still never told "undone".
    _refund_by_hand(shop)
    settled = cancel(shop.app, a.id, "refunded at the gateway", payments_handled=True)
    assert settled.state.value == "CANCELLED"
    assert not list_waits(shop.app) and list_failed_after_payment(shop.app) == []
    assert tasks.later_click() == [False]
    assert len(shop.gateway.payments) == 1 and shop.net_paid() == 0


@pytest.mark.parametrize("settled_as", ["refunded", "kept"])
def test_a_settled_step_is_never_read_undone_by_a_click(shop: PaymentShop, settled_as: str) -> None:
    """A person who settles the wait (``--payments-handled``) may have refunded the charge
    or decided to keep it; the store cannot tell which, so the step never reads undone
    and no click opens a new attempt by itself (read undone, a kept charge was paid
    twice)."""
    tasks = TwoTasks(shop, "release-stock")
    a, _ = tasks.run()
    if settled_as == "refunded":
        _refund_by_hand(shop)
    cancel(shop.app, a.id, f"{settled_as} at the gateway", payments_handled=True)
    assert tasks.later_click() == [False]
    assert len(shop.gateway.payments) == 1
    assert shop.net_paid() == (0 if settled_as == "refunded" else 1000)
    assert list_failed_after_payment(shop.app) == []


def test_the_same_undo_with_other_arguments_leaves_it_to_a_person(shop: PaymentShop) -> None:
    """Arguments count: the claimer's refund of a part (100) does not cover another's
    refund of the whole; that one waits for a person, nothing read undone."""
    tasks = TwoTasks(shop, "refund-charge", other_arguments={"amount": 100})
    a, b = tasks.run()
    assert tasks.ran == ["refund-charge"]
    assert_waits_for_an_operator(a, "UndoNotCoveredError", _step_handle(shop, a.id), b.id)
    assert tasks.later_click() == [False]
    assert len(shop.gateway.payments) == 1


def test_the_reason_tells_the_person_what_ran_and_to_check_the_gateway(
    shop: PaymentShop,
) -> None:
    tasks = TwoTasks(shop, "release-stock")
    a, b = tasks.run()
    reason = a.reason or ""
    assert b.id in reason, reason
    assert "release-stock" in reason and "refund-charge" in reason, reason
    assert "gateway" in reason and "done" in reason, reason


def test_two_waits_on_one_charge_each_say_one_settlement_is_for_both(
    shop: PaymentShop,
) -> None:
    """Two refunds' executions wait on one charge a stock release claimed: each reason
    says one settlement is for both; the step reads undone only once both are ended."""
    tasks = TwoTasks(shop, "release-stock")
    with shop.worker(concurrency=3):
        a = str(tasks.checkout.delay("u-1").id)
        assert tasks.reached["a"].wait(GATE_SECONDS)
        c = str(tasks.checkout_again.delay("u-1").id)
        assert tasks.reached["c"].wait(GATE_SECONDS)
        b = str(tasks.reserve_and_pay.delay("u-1").id)
        assert tasks.reached["b"].wait(GATE_SECONDS)
        for waiting, gate in ((a, tasks.gates["a"]), (c, tasks.gates["c"])):
            gate.set()
            wait_until(
                lambda x=waiting: (shop.execution(x).reason or "").startswith(UNDO_WAITS),
                20,
                message="each refund's execution waits for the claimer",
            )
        tasks.gates["b"].set()
        shop.wait_state(b, *ENDED, timeout=30)  # it claims before a re-drive of the others

        def all_ended() -> bool:
            if all(shop.execution(x).state.value in ENDED for x in (a, b, c)):
                return True
            shop.clock.advance(shop.agboss.executions.shared_wait_ms / 1000 + 1)
            shop.sweep()
            return False

        wait_until(all_ended, 40, interval=0.3, message="all three ended")
    waits = {w.execution.id: w.execution for w in list_waits(shop.app)}
    assert set(waits) == {a, c}, waits
    for x in (a, c):
        assert "one settlement is for all of them" in (waits[x].reason or "")
    assert (len(shop.gateway.payments), len(shop.gateway.refunds)) == (1, 0)
    _refund_by_hand(shop)
    cancel(shop.app, a, "refunded at the gateway", payments_handled=True)
    cancel(shop.app, c, "refunded at the gateway", payments_handled=True)
    assert tasks.later_click() == [False]  # a person decides on a new attempt
    assert len(shop.gateway.payments) == 1 and shop.net_paid() == 0
