"""The chaos explorer's verdict, judged on made-up witnesses (no process, no database).

What a run must not call OK: a payment at the gateway for no order of the run, orders
that were never placed (some, or all of them), and a single payment of another amount
than the order's. The exit code follows the verdict: money wrong 1, incomplete 2.
"""

from __future__ import annotations

import json
from typing import Any

from celery_agboss.chaos import EXIT_COULD_NOT_RUN, EXIT_MONEY_WRONG, EXIT_OK
from celery_agboss.chaos.run import exit_code
from celery_agboss.chaos.shop import AMOUNT_BASE, APP_SOURCE, CURRENCY, ShopConfig, amount_of
from celery_agboss.chaos.verdict import (
    LOST,
    PAID_ONCE,
    PAID_TWICE,
    Execution,
    OrderOutcome,
    Verdict,
    classify,
    summarise,
)

COMPLETED = Execution("COMPLETED", None)


def payment(order: int, amount: int | None = None, *, pid: str | None = None) -> dict[str, Any]:
    """A payment as the fake gateway lists it (the fields the verdict reads), captured."""
    amount = amount_of(order) if amount is None else amount
    return {
        "id": pid or f"ch_{order}",
        "amount": amount,
        "currency": CURRENCY,
        "status": "succeeded",
        "amount_captured": amount,
        "reference": f"order:{order}",
        "metadata": {"attempt": 1},
    }


def paid_orders(*orders: int) -> list[OrderOutcome]:
    """Each order paid once, the right amount, marked paid, its execution COMPLETED."""
    return summarise(
        {o: f"task-{o}" for o in orders},
        [payment(o) for o in orders],
        [],
        {str(o): ("paid", f"ch_{o}") for o in orders},
        {f"task-{o}": COMPLETED for o in orders},
    )


def verdict(
    orders: list[OrderOutcome],
    *,
    requested: int | None = None,
    not_placed: int = 0,
    stray: int = 0,
) -> Verdict:
    return Verdict(
        seed=7,
        orders=orders,
        phantom_refunds=0,
        faults={},
        skipped_faults={},
        duration_seconds=1.0,
        gateway={},
        settings={},
        stray_payments=stray,
        not_placed=not_placed,
        orders_requested=len(orders) + not_placed if requested is None else requested,
    )


def headline(v: Verdict) -> str:
    return v.render("agboss show").splitlines()[0]


def test_every_order_paid_once_is_ok_and_complete() -> None:
    v = verdict(paid_orders(1, 2, 3))
    assert [o.verdict for o in v.orders] == [PAID_ONCE] * 3
    assert v.ok and v.complete
    assert headline(v).startswith("chaos verdict: OK ")
    assert exit_code(v) == EXIT_OK


def test_a_payment_for_no_order_makes_the_money_wrong() -> None:
    v = verdict(paid_orders(1, 2), stray=1)
    assert not v.ok
    assert exit_code(v) == EXIT_MONEY_WRONG
    rendered = v.render("agboss show")
    assert "MONEY WRONG" in headline(v)
    row = next(line for line in rendered.splitlines() if "payments for no order" in line)
    assert "1" in row and "must be 0" in row
    data = json.loads(json.dumps(v.as_json()))
    assert data["stray_payments"] == 1 and data["ok"] is False


def test_orders_not_placed_make_the_run_incomplete() -> None:
    v = verdict(paid_orders(1, 2, 3), not_placed=2)
    assert v.ok and not v.complete
    line = headline(v)
    assert "INCOMPLETE" in line and "3 of 5 orders" in line
    assert "covers those 3 only" in v.render("agboss show")
    assert exit_code(v) == EXIT_COULD_NOT_RUN
    data = v.as_json()
    assert (data["complete"], data["not_placed"], data["orders_requested"]) == (False, 2, 5)


def test_a_run_that_placed_no_order_is_not_complete() -> None:
    v = verdict([], requested=4, not_placed=4)
    assert not v.complete
    assert "INCOMPLETE" in headline(v) and "0 of 4 orders" in headline(v)
    assert exit_code(v) == EXIT_COULD_NOT_RUN


def test_fewer_orders_judged_than_requested_is_not_complete_even_unaccounted() -> None:
    """An order neither judged nor counted as not placed still leaves the run incomplete."""
    v = verdict(paid_orders(1), requested=2, not_placed=0)
    assert not v.complete and exit_code(v) == EXIT_COULD_NOT_RUN


def test_money_wrong_outranks_incomplete() -> None:
    v = verdict(paid_orders(1), not_placed=1, stray=1)
    assert "MONEY WRONG" in headline(v)
    assert exit_code(v) == EXIT_MONEY_WRONG


def test_a_single_payment_of_the_wrong_amount_is_lost() -> None:
    wrong = amount_of(5) + 1
    outcome = classify(5, "t5", [payment(5, wrong)], 0, ("paid", "ch_5"), COMPLETED)
    assert outcome.verdict == LOST
    assert str(wrong) in outcome.detail and str(amount_of(5)) in outcome.detail
    v = verdict([outcome])
    assert not v.ok and exit_code(v) == EXIT_MONEY_WRONG


def test_a_single_payment_of_the_right_amount_is_paid_once() -> None:
    outcome = classify(5, "t5", [payment(5)], 0, ("paid", "ch_5"), COMPLETED)
    assert outcome.verdict == PAID_ONCE


def test_two_payments_stay_paid_twice_whatever_their_amounts() -> None:
    two = [payment(5, 1, pid="ch_a"), payment(5, pid="ch_b")]
    assert classify(5, "t5", two, 0, ("paid", "ch_b"), COMPLETED).verdict == PAID_TWICE


def test_the_generated_shop_reads_its_amount_from_the_one_home() -> None:
    config = ShopConfig("r", "redis://x", "sqlite:////x", "http://127.0.0.1:1", "k", {})
    assert config.as_json()["amount_base"] == AMOUNT_BASE
    assert amount_of(7) == AMOUNT_BASE + 7
    assert 'CONFIG["amount_base"] + order_id' in APP_SOURCE
    assert str(AMOUNT_BASE) not in APP_SOURCE  # no second home for the amount
