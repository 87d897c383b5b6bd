"""Tasks of the shop that only some scenarios use: an assistant's tool calls, fulfilment
branches, refunds an operator or the customer asks for, card retries, captures and voids.

Each protected task is a ``PaymentTask`` written as the README's snippet is; its plain
twin (``plain.<name>``, what the scenarios' "unprotected" column runs) is what a careful
Celery user writes without celery_agboss: ``acks_late``, ``autoretry_for`` the SDK's
connection errors, and the official SDK, which gives every POST a fresh key of its own.
"""

from __future__ import annotations

from typing import Any

import stripe as stripe_sdk
from sqlalchemy import CheckConstraint, Column, Connection, Integer, String, Table, select, update
from sqlalchemy.exc import IntegrityError

from celery_agboss import IdempotencyKeyConflictError, PaymentTask
from example_project import orders
from example_project.shop import agboss, app, mark_paid, payment_request, refund, stripe
from example_project.unprotected import PLAIN, create_intent, engine, read, refund_intent


def _read(order_id: str) -> dict[str, Any]:
    """A plain read: harmless to repeat, so it needs no fence."""
    with agboss.store.engine.connect() as conn:
        return orders.load(conn, order_id)


# --- an assistant calls the charge tool (design: PS7) ---------------------------------


def _charge_tool(task: PaymentTask, order: dict[str, Any], amount: int) -> dict[str, Any]:
    """The charge tool: its key is the order the execution works on, never text the model
    wrote; the amount the model gave is in the request, so another amount is refused."""
    order_id = str(order["id"])
    request = {**payment_request(order), "amount": amount}
    try:
        receipt = task.outbound(stripe.charge, request, business_key=f"order:{order_id}")
    except IdempotencyKeyConflictError:
        refused = "this order was already charged with another amount"
        return {"tool": "charge", "amount": amount, "refused": refused}
    outcome = task.last_outcome
    paid = mark_paid(task, order_id, receipt)  # the model is told when Stripe took nothing yet
    return {
        "tool": "charge",
        "amount": amount,
        "payment": receipt["id"],
        "outcome": None if outcome is None else outcome.value,
        "paid": paid,
    }


@app.task(base=PaymentTask, bind=True)
def assistant_session(
    self: PaymentTask, order_id: str, tool_calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One assistant loop over one order: the tool calls the model made, in order (the
    demo's model is a script); each tool's answer, a refusal included, goes back to it."""
    order = _read(order_id)
    transcript: list[dict[str, Any]] = []
    for call in tool_calls:
        if call.get("tool") == "charge":
            transcript.append(_charge_tool(self, order, int(call["amount"])))
        else:
            transcript.append({"tool": call.get("tool"), "error": "no such tool"})
    return transcript


@app.task(name="plain.assistant_session", **PLAIN)
def plain_assistant_session(self: Any, order_id: str, tool_calls: list[dict[str, Any]]) -> int:
    order = read(order_id)
    charged = 0
    for call in tool_calls:
        if call.get("tool") == "charge":
            intent = create_intent({**order, "amount": int(call["amount"])})
            with engine().begin() as conn:
                orders.mark_paid(conn, order_id, intent.id)
            charged += 1
    return charged


# --- parallel branches of one order (design: PS9) -------------------------------------


@app.task(base=PaymentTask, bind=True)
def ship_part(self: PaymentTask, order_id: str, part: str) -> dict[str, Any]:
    """One branch of a fulfilment group: make sure the order is paid, then ship a part.
    Every branch charges under the order's key, so the order is charged once; nothing
    ships while Stripe has not taken the money (``paid_in_full``)."""
    order = _read(order_id)
    receipt = self.outbound(stripe.charge, payment_request(order), business_key=f"order:{order_id}")
    if not mark_paid(self, order_id, receipt):
        return {"part": part, "payment": receipt["id"], "not_shipped": receipt.get("status")}
    self.fenced_effect(
        "ship",
        lambda conn: orders.note(conn, order_id, "shipped", part),
        business_key=f"shipment:{order_id}:{part}",
    )
    return {"part": part, "payment": receipt["id"]}


@app.task(name="plain.ship_part", **PLAIN)
def plain_ship_part(self: Any, order_id: str, part: str) -> str:
    order = read(order_id)
    if order["status"] != "paid":  # the check a careful branch makes; both branches pass it
        intent = create_intent(order)
        with engine().begin() as conn:
            orders.mark_paid(conn, order_id, intent.id)
    with engine().begin() as conn:
        orders.note(conn, order_id, "shipped", part)
    return part


budgets = Table(
    "shop_budgets",
    orders.metadata,
    Column("customer", String(80), primary_key=True),
    Column("remaining", Integer, nullable=False),
    # The aggregate's invariant is the application's: the row refuses to go below zero.
    CheckConstraint("remaining >= 0", name="shop_budget_not_overspent"),
)
"""A customer's spending budget that parallel branches draw on (design: PS9)."""


def _reserve(order_id: str, customer: str, amount: int) -> Any:
    def reserve(conn: Connection) -> None:
        remaining = budgets.c.remaining - amount
        conn.execute(
            update(budgets).where(budgets.c.customer == customer).values(remaining=remaining)
        )

    return reserve


@app.task(base=PaymentTask, bind=True)
def spend_budget(self: PaymentTask, order_id: str, customer: str) -> dict[str, Any]:
    """A branch that charges an order against the customer's budget: the budget is drawn
    in a fenced effect, where the row's own constraint refuses an overspend, then the
    order is charged under its key."""
    order = _read(order_id)
    try:
        self.fenced_effect(
            "draw-budget",
            _reserve(order_id, customer, int(order["amount"])),
            business_key=f"budget:{order_id}",
        )
    except IntegrityError:  # rolled back with the effect: nothing drawn, nothing recorded
        return {"refused": f"{order['amount']} is over {customer}'s budget"}
    receipt = self.outbound(stripe.charge, payment_request(order), business_key=f"order:{order_id}")
    return {"payment": receipt["id"], "paid": mark_paid(self, order_id, receipt)}


@app.task(name="plain.spend_budget", **PLAIN)
def plain_spend_budget(self: Any, order_id: str, customer: str) -> str:
    """Check the budget, charge, then draw it: each step as plain code writes it."""
    order = read(order_id)
    with engine().connect() as conn:
        remaining = conn.execute(
            select(budgets.c.remaining).where(budgets.c.customer == customer)
        ).scalar_one()
    if remaining < order["amount"]:
        return "over budget"
    intent = create_intent(order)
    with engine().begin() as conn:
        orders.mark_paid(conn, order_id, intent.id)
    with engine().begin() as conn:
        _reserve(order_id, customer, int(order["amount"]))(conn)
    return str(intent.id)


# --- a refund an operator or the customer asks for (design: PS19) ---------------------


@app.task(base=PaymentTask, bind=True)
def refund_payment(self: PaymentTask, order_id: str, payment_id: str, by: str) -> dict[str, Any]:
    """An operator's or the customer's refund of a payment they name (the dashboard, the
    receipt): through the shop's one ``refund()``, so under the saga's key too."""
    return {**refund(self, order_id, payment_id), "by": by}


@app.task(name="plain.refund_payment", **PLAIN)
def plain_refund_payment(self: Any, order_id: str, payment_id: str, by: str) -> str:
    done = refund_intent(payment_id)
    with engine().begin() as conn:
        orders.move(conn, order_id, "refunded")
        orders.note(conn, order_id, "refunded", done.id)
    return str(done.id)


# --- another card after a decline (design: PS22) --------------------------------------


def attempt_key(order_id: str, n: int) -> str:
    """The business key of the order's n-th payment attempt (numbered on the order row)."""
    return f"order:{order_id}:attempt:{n}"


class NoNewAttempt(Exception):
    """The previous attempt is not known to be declined: no next attempt is started."""


def _charge_attempt(task: PaymentTask, order_id: str, n: int, card: str) -> dict[str, Any]:
    """Charge attempt ``n`` with ``card``; a decline is recorded as that attempt's outcome."""
    request = {**payment_request(_read(order_id)), "source": card}
    try:
        receipt = task.outbound(stripe.charge, request, business_key=attempt_key(order_id, n))
    except stripe_sdk.CardError:
        task.fenced_effect(
            "declined",
            lambda conn: orders.note(conn, order_id, "declined", f"attempt:{n}"),
            business_key=attempt_key(order_id, n),
        )
        return {"attempt": n, "declined": True}
    outcome = task.last_outcome
    return {
        "attempt": n,
        "payment": receipt["id"],
        "outcome": None if outcome is None else outcome.value,
        "paid": mark_paid(task, order_id, receipt),
    }


@app.task(base=PaymentTask, bind=True)
def pay_attempt(self: PaymentTask, order_id: str) -> dict[str, Any]:
    """The checkout's charge, as the order row's current attempt. The attempt is read in a
    fenced effect, so a re-run charges the same attempt even after the row moved on."""

    def current(conn: Connection) -> dict[str, Any]:
        order = orders.load(conn, order_id)
        return {"attempt": int(order["attempt"]), "card": order["card"]}

    pinned = self.fenced_effect("attempt", current)
    return _charge_attempt(self, order_id, pinned["attempt"], pinned["card"])


@app.task(base=PaymentTask, bind=True)
def retry_with_card(self: PaymentTask, order_id: str, card: str) -> dict[str, Any]:
    """The customer tries another card. The next attempt starts only once the previous
    one is known to be declined, never after an unknown outcome (it may have charged)."""

    def start_next(conn: Connection) -> dict[str, Any]:
        order = orders.load(conn, order_id)
        n = int(order["attempt"])
        if order["status"] != "new":
            raise NoNewAttempt(f"the order is {order['status']}")
        if ("declined", f"attempt:{n}") not in orders.entries(conn, order_id):
            raise NoNewAttempt(f"attempt {n}'s outcome is not known yet")
        # A compare-and-set on the number: two retries at once start one attempt.
        moved = conn.execute(
            update(orders.orders)
            .where(orders.orders.c.id == order_id, orders.orders.c.attempt == n)
            .values(attempt=n + 1, card=card)
        )
        if moved.rowcount != 1:
            raise NoNewAttempt(f"attempt {n + 1} was started by another retry")
        return {"attempt": n + 1, "card": card}

    try:
        started = self.fenced_effect("next-attempt", start_next, request={"card": card})
    except NoNewAttempt as refused:  # nothing was written: a later retry may still move on
        return {"refused": str(refused)}
    return _charge_attempt(self, order_id, started["attempt"], started["card"])


def _plain_attempt(order_id: str) -> str:
    order = read(order_id)
    try:
        intent = create_intent(order)
    except stripe_sdk.CardError:
        with engine().begin() as conn:
            orders.note(conn, order_id, "declined", f"attempt:{order['attempt']}")
        return "declined"
    with engine().begin() as conn:
        orders.mark_paid(conn, order_id, intent.id)
    return str(intent.id)


@app.task(name="plain.pay_attempt", **PLAIN)
def plain_pay_attempt(self: Any, order_id: str) -> str:
    return _plain_attempt(order_id)


@app.task(name="plain.retry_with_card", **PLAIN)
def plain_retry_with_card(self: Any, order_id: str, card: str) -> str:
    """The customer says it failed; plain code believes them and charges the new card."""
    with engine().begin() as conn:
        orders.next_attempt(conn, order_id)
        orders.set_card(conn, order_id, card)
    return _plain_attempt(order_id)


# --- an authorisation, its captures and its void (design: PS18, PS20) -----------------


@app.task(name="plain.authorize_order", **PLAIN)
def plain_authorize_order(self: Any, order_id: str) -> str:
    intent = create_intent(read(order_id), capture=False)
    with engine().begin() as conn:
        orders.move(conn, order_id, "authorized", intent.id)
    return str(intent.id)


@app.task(name="plain.capture_shipment", **PLAIN)
def plain_capture_shipment(self: Any, order_id: str, shipment: int, amount: int) -> str:
    payment_id = read(order_id)["payment_id"]
    stripe.client.v1.payment_intents.capture(payment_id, params={"amount_to_capture": amount})
    with engine().begin() as conn:
        orders.note(conn, order_id, "captured", str(amount))
    return str(payment_id)


@app.task(name="plain.settle_authorization", **PLAIN)
def plain_settle_authorization(self: Any, order_id: str, action: str) -> str:
    """Capture (fulfilment) or void (the customer cancelled), each as it comes."""
    payment_id = read(order_id)["payment_id"]
    intents = stripe.client.v1.payment_intents
    if action == "capture":
        intents.capture(payment_id)
    else:
        intents.cancel(payment_id)
    status = "captured" if action == "capture" else "voided"
    with engine().begin() as conn:
        orders.note(conn, order_id, f"disposition:{action}")
        orders.move(conn, order_id, status)
    return status


# --- one key, two senders (design: PS23) ----------------------------------------------
