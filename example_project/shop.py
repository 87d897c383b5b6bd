"""The shop's Celery app: every payment through celery_agboss, through Stripe's official SDK.

``celery -A example_project.shop worker -l INFO`` and ``celery -A example_project.shop beat``
run it; ``example_project.config`` says where its database, broker and gateway are. In the
demo the SDK talks to ``celery_agboss.testing.FakeGatewayServer`` (its Stripe dialect);
point ``STRIPE_API_BASE`` away and set a test-mode ``STRIPE_API_KEY`` to use Stripe's own
sandbox. Stripe is named only to identify its public API; no affiliation or endorsement.

What each task shows (the scenarios in ``example_project.scenarios`` drive them):
``charge_order`` (a charge, the order marked paid, a receipt through the outbox),
``place_order`` (a saga: refunded once when the order cannot be fulfilled),
``checkout_3ds`` (a 3-D Secure-style pause answered by the return page or the webhook),
``approve_large_order`` (a person's approval, answered once), ``capture_shipment`` and
``settle_authorization`` (captures, voids and their keys), ``refund_order`` (one refund
key for every path) and ``handle_stripe_event`` (a webhook applied once, status only
forward). An order is marked paid only when Stripe took its money (``paid_in_full``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from celery import Celery
from sqlalchemy import Connection

from celery_agboss import AGBoss, PaymentTask, outbox, undo_function
from celery_agboss.adapters.stripe import (
    StripeAdapter,
    intent_result,
    is_definite_stripe_failure,
    refund_result,
)
from celery_agboss.webhooks import WebhookEvent, record_event
from example_project import config, dispositions, orders
from example_project.dispositions import dispose, refused

app = Celery("example_project", broker=config.broker_url())
app.conf.update(
    broker_transport=config.broker_transport(config.broker_url()),
    broker_transport_options=config.broker_transport_options(config.broker_url()),
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    agboss_database_url=config.database_url(),
    agboss_pseudonym_key=config.pseudonym_key(),
)
agboss = AGBoss(app)

stripe = StripeAdapter(config.stripe_api_key(), base_url=config.stripe_api_base())
for call in stripe.calls:
    agboss.register(call)


def _read(order_id: str) -> dict[str, Any]:
    """A plain read: harmless to repeat, so it needs no fence."""
    with agboss.store.engine.connect() as conn:
        return orders.load(conn, order_id)


SHOP_CHARGE = "shop_charge"
"""The metadata field naming the order on every PaymentIntent the shop creates for it (its
charges, authorisations and checkout page): how ``own_payment`` tells them from another
PaymentIntent carrying the same ``reference`` (a duplicate made in Stripe's dashboard)."""


def payment_request(order: dict[str, Any]) -> dict[str, Any]:
    return {
        "amount": order["amount"],
        "currency": order["currency"],
        "reference": order["id"],
        "source": order["card"],
        "metadata": {SHOP_CHARGE: order["id"]},
    }


def paid_in_full(
    result: Mapping[str, Any], order: Mapping[str, Any], *, authorised: bool = False
) -> bool:
    """Whether Stripe took the order's money: the PaymentIntent (as ``intent_result``
    writes it, ISO 4217 minor units) ``succeeded`` with at least the order's amount
    received, in the order's currency; for an authorisation (``authorised``),
    ``requires_capture`` with at least that amount capturable. Stripe answers a
    create-and-confirm with HTTP 200 at ``requires_action`` (3-D Secure) or ``processing``
    too, having taken nothing yet, and another PaymentIntent of the order may be an older,
    smaller one: an order marked paid on those ships goods nobody paid for."""
    status, field = "succeeded", "amount_received"
    if authorised:
        status, field = "requires_capture", "amount_capturable"
    amount = result.get(field)
    return (
        result.get("status") == status
        and str(result.get("currency") or "").lower() == str(order["currency"]).lower()
        and isinstance(amount, int)
        and amount >= int(order["amount"])
    )


def mark_paid(
    task: PaymentTask,
    order_id: str,
    result: Mapping[str, Any],
    then: Callable[[Connection], None] | None = None,
) -> bool:
    """Mark the order paid by the charge's ``result`` (and run ``then`` in the same
    transaction), once: keyed by the order, so any execution for it marks it once. Only
    when ``paid_in_full``; otherwise the order is left as it is, noted ``charge:<status>``,
    and Stripe's webhook marks it paid once the money is taken (``handle_stripe_event``).
    True when it is paid."""

    def paid(conn: Connection) -> bool:
        if not paid_in_full(result, orders.load(conn, order_id)):
            orders.note(conn, order_id, f"charge:{result.get('status')}", result["id"])
            return False
        orders.mark_paid(conn, order_id, result["id"])
        if then is not None:
            then(conn)
        return True

    return bool(task.fenced_effect("mark-paid", paid, business_key=f"order:{order_id}"))


def refund_key(payment_id: str, n: int = 1) -> str:
    """The one place a refund's key is built: the saga's undo, an operator and the
    customer's request all refund under it, so a payment is refunded once (design: PS19)."""
    return f"refund:{payment_id}:{n}"


@app.task(base=PaymentTask, bind=True)
def charge_order(self: PaymentTask, order_id: str) -> dict[str, Any]:
    order = _read(order_id)
    receipt = self.outbound(stripe.charge, payment_request(order), business_key=f"order:{order_id}")

    def send_the_receipt(conn: Connection) -> None:
        outbox.enqueue(conn, send_receipt.s(order_id))  # sent if and only if this commits

    mark_paid(self, order_id, receipt, then=send_the_receipt)
    return receipt


@app.task(base=PaymentTask, bind=True)
def send_receipt(self: PaymentTask, order_id: str) -> int:
    """The follow-up the outbox publishes: a PaymentTask, so a copy of it runs once."""
    return self.fenced_effect(
        "receipt",
        lambda conn: orders.note(conn, order_id, "receipt"),
        business_key=f"receipt:{order_id}",
    )


@app.task(base=PaymentTask, bind=True)
def place_order(self: PaymentTask, order_id: str) -> dict[str, Any]:
    """Charge, then reserve the goods; out of stock refunds the charge, once, then FAILED.
    A charge Stripe has not decided yet (``requires_action``, ``processing``) is waited
    for as the checkout waits (``outcome_pause``: Stripe's webhook answers), noted
    ``saga:<status>``; then the saga reads the PaymentIntent and, if it took the order's
    amount, reserves (or refunds) and marks the order paid; one that took nothing reserves
    nothing (noted ``charge:<status>``). The webhook never marks a waiting saga's order
    paid (``handle_stripe_event``): the saga does, after the reservation."""
    order = _read(order_id)
    receipt = self.outbound(stripe.charge, payment_request(order), business_key=f"order:{order_id}")
    self.undo_with("shop.refund-payment", payment_id=receipt["id"], order_id=order_id)
    if receipt.get("status") in STILL_PENDING:
        waiting = f"{SAGA_WAITS}{receipt.get('status')}"
        note = lambda conn: orders.note(conn, order_id, waiting, receipt["id"])  # noqa: E731
        self.fenced_effect("saga-waits", note, business_key=f"order:{order_id}:waits")
        for n in itertools.count(1):
            receipt = _charge_reading(self, order_id, receipt, n)
            if receipt.get("status") not in STILL_PENDING:
                break
    if paid_in_full(receipt, order):
        self.fenced_effect("reserve", lambda conn: orders.reserve(conn, order_id, order["sku"]))
    mark_paid(self, order_id, receipt)
    return receipt


SAGA_WAITS = "saga:"
"""The ledger entry (``saga:<status>``) of a saga waiting for its charge's outcome."""


def _charge_reading(
    task: PaymentTask, order_id: str, last: Mapping[str, Any], n: int
) -> dict[str, Any]:
    """The saga's ``n``-th wait for its charge's outcome (named as the checkout's, so the
    webhook answers it: ``web.answer_checkout``), then Stripe's PaymentIntent, kept per
    wait: a re-run takes the same branch (design: divergence)."""
    payload: dict[str, Any] = {"payment_id": last["id"]}
    if n > OUTCOME_ROUNDS:
        payload["operator"] = (
            f"Stripe still showed {last['id']} as {last.get('status')} after {n - 1} "
            "readings: check it in Stripe's dashboard, then answer this pause to read it "
            "again, or cancel this execution (agboss cancel; its undo refunds the charge)"
        )
    name = outcome_pause(n)
    task.pause(name, payload, accept_early=True)
    current = intent_result(stripe.client.v1.payment_intents.retrieve(last["id"]).to_dict())
    kept = task.fenced_effect(
        "charge-outcome", lambda conn: current, business_key=f"order:{order_id}:{name}"
    )
    return dict(kept)


@undo_function(app, "shop.refund-payment")
def refund_payment(task: PaymentTask, undo: Any, payment_id: str, order_id: str) -> None:
    refund(task, order_id, payment_id)


def refunded_in_full(refunds: Iterable[Mapping[str, Any]], order: Mapping[str, Any]) -> bool:
    """Whether Stripe gave the customer the order's amount back: its refunds (as
    ``refund_result`` writes them, ISO 4217 minor units) that ``succeeded`` in the order's
    currency add up to the order's amount. A ``pending`` or ``requires_action`` refund has
    returned nothing yet, a ``failed`` or ``canceled`` one never will, and a partial refund
    leaves the rest paid: an order marked refunded on those tells the customer they got
    money back that nobody sent."""
    currency = str(order["currency"]).lower()
    back = sum(
        refund["amount"]
        for refund in refunds
        if refund.get("status") == "succeeded"
        and str(refund.get("currency") or "").lower() == currency
        and isinstance(refund.get("amount"), int)
    )
    return back >= int(order["amount"])


def refund(task: PaymentTask, order_id: str, payment_id: str, n: int = 1) -> dict[str, Any]:
    """Refund through the outbound call under the payment's one refund key. The order is
    marked refunded only when Stripe's answer says the money went back; a refund still
    pending is noted (``refund:pending``) and its outcome comes by webhook
    (``handle_stripe_event``)."""
    done = task.outbound(
        stripe.refund, {"payment_id": payment_id}, business_key=refund_key(payment_id, n)
    )

    def mark_refunded(conn: Connection) -> None:
        if not refunded_in_full([done], orders.load(conn, order_id)):
            orders.note(conn, order_id, f"refund:{done.get('status')}", done["id"])
            return
        orders.move(conn, order_id, "refunded")
        orders.note(conn, order_id, "refunded", done["id"])

    task.fenced_effect("mark-refunded", mark_refunded, business_key=refund_key(payment_id, n))
    return done


@app.task(base=PaymentTask, bind=True)
def refund_order(self: PaymentTask, order_id: str, n: int = 1) -> dict[str, Any]:
    """The customer's or an operator's refund: the same key as the saga's undo."""
    return refund(self, order_id, _read(order_id)["payment_id"], n)


@app.task(base=PaymentTask, bind=True)
def approve_large_order(self: PaymentTask, order_id: str) -> dict[str, Any]:
    """A person approves before a large charge; the pause is answered once (design: PS11)."""
    answer = self.pause("approve", {"order": order_id})
    if not answer.get("approved"):
        return {"declined_by": answer.get("by")}
    order = _read(order_id)
    receipt = self.outbound(stripe.charge, payment_request(order), business_key=f"order:{order_id}")
    mark_paid(self, order_id, receipt)
    return {**receipt, "approved_by": answer.get("by")}


# The waits of a 3-D Secure checkout for its outcome: ``3ds``, ``3ds-2``, …; the return page
# and the webhook answer the first OUTCOME_ROUNDS of them, a later one waits for an operator.
OUTCOME_ROUNDS = 5
STILL_PENDING = frozenset({"requires_action", "processing"})  # Stripe has decided nothing yet


def outcome_pause(n: int) -> str:
    """The name of the checkout's ``n``-th wait for the customer's authentication."""
    return "3ds" if n == 1 else f"3ds-{n}"


@app.task(base=PaymentTask, bind=True)
def checkout_3ds(self: PaymentTask, order_id: str) -> dict[str, Any]:
    """Authorise, wait for the customer's authentication (the return page or the
    webhook answers, once), read the outcome from Stripe, then capture (design: PS21).
    A reading still pending (the return page answered before the bank did) is no
    outcome: the checkout waits again, under the next name (``outcome_pause``). While the
    customer authenticates Stripe holds nothing: the order is not ``authorized`` (noted
    ``charge:requires_action``, its PaymentIntent kept), so fulfilment does not settle it."""
    authorization = authorize(self, order_id)
    status = "requires_action"
    for n in itertools.count(1):
        status = _outcome_reading(self, order_id, authorization["id"], n, status)
        if status not in STILL_PENDING:
            break
    if status != "requires_capture":
        # Authentication failed or was cancelled: nothing held now. The customer may confirm
        # the PaymentIntent again before this note commits, its event then seeing no
        # ``gave_up``: the capture enqueued with the note reads Stripe after the commit.
        def gave_up_on_it(conn: Connection) -> None:
            orders.note(conn, order_id, f"checkout:{status}", authorization["id"])
            outbox.enqueue(conn, capture_retried_checkout.s(order_id, authorization["id"]))

        self.fenced_effect(
            "3ds-not-captured", gave_up_on_it, business_key=f"authorization:{order_id}"
        )
        return {"not_captured": status}
    return capture_whole(self, order_id, authorization["id"])


def capture_whole(task: PaymentTask, order_id: str, payment_id: str) -> dict[str, Any]:
    """The checkout's capture of its authorisation (``checkout_3ds``,
    ``capture_retried_checkout``), decided through its one disposition (``dispose``) as
    fulfilment's is: a cancel or a shipment recorded first stands it down, nothing sent;
    a cancel after it becomes its refund. Sent under the disposition's key, as every whole
    capture of the authorisation is, so once; the order marked paid by it. An earlier whole
    capture Stripe refused (fulfilment's, sent while the customer still authenticated)
    holds nothing: this one is the disposition's next round (``dispose``)."""
    first, key = dispose(task, order_id, payment_id, "capture")
    if first != "capture":
        return refused(task, order_id, payment_id, "capture", first, key)
    captured = _capture(task, order_id, payment_id, key)
    mark_paid(task, order_id, captured)
    return captured


def gave_up(conn: Connection, order_id: str, payment_id: str) -> bool:
    """Whether the order's checkout ended without capturing the PaymentIntent (3-D Secure
    failed or was cancelled: noted ``checkout:<status>`` by ``checkout_3ds``)."""
    ended = orders.entries(conn, order_id)
    return any(entry.startswith("checkout:") and ref == payment_id for entry, ref in ended)


@app.task(base=PaymentTask, bind=True)
def capture_retried_checkout(self: PaymentTask, order_id: str, payment_id: str) -> Any:
    """The customer confirmed the PaymentIntent again (Stripe allows it after
    ``requires_payment_method``) once its checkout had given up on it (``gave_up``), and
    Stripe holds the amount: captured as the checkout captures (``capture_whole``), so
    once, and never after the customer's cancel. Sent by the checkout's give-up (outbox)
    and by ``web.stripe_webhook`` per authorisation; nothing held, it does nothing."""
    shown = intent_result(stripe.client.v1.payment_intents.retrieve(payment_id).to_dict())

    def held(conn: Connection) -> bool:
        # Kept: a re-run after the capture reads "succeeded", and must capture (replay) again.
        order = orders.load(conn, order_id)
        authorised = paid_in_full(shown, order, authorised=True)
        return (
            gave_up(conn, order_id, payment_id) and order["payment_id"] == payment_id and authorised
        )

    if not self.fenced_effect("retried-checkout", held):
        return {"not_captured": shown.get("status")}
    return capture_whole(self, order_id, payment_id)


def _outcome_reading(task: PaymentTask, order_id: str, payment_id: str, n: int, last: str) -> str:
    """Wait the ``n``-th time, then Stripe's status of the authorisation, kept per wait."""
    payload: dict[str, Any] = {"payment_id": payment_id}
    if n > OUTCOME_ROUNDS:
        payload["operator"] = (
            f"Stripe still showed {payment_id} as {last} after {n - 1} readings: check it in "
            "Stripe's dashboard, then answer this pause to read it again, or void the "
            "authorisation and cancel this execution (agboss cancel)"
        )
    name = outcome_pause(n)
    # The return page or the webhook may answer before the body gets here (the bank
    # answered in milliseconds): that answer is kept and taken here (design: early answers).
    task.pause(name, payload, accept_early=True)
    # The answer is a hint: the payment's state is what Stripe says (design: G6). Each
    # wait's reading is kept in a fenced effect and every re-run branches on it: a re-run
    # after the capture would read "succeeded" and skip the capture it already made
    # (design: divergence), and the order would never be marked paid.
    current = str(stripe.client.v1.payment_intents.retrieve(payment_id).status)
    return str(
        task.fenced_effect(
            "3ds-outcome", lambda conn: current, business_key=f"authorization:{order_id}:{name}"
        )
    )


def authorize(task: PaymentTask, order_id: str) -> dict[str, Any]:
    """Authorise the order's amount (captured later): the order is ``authorized`` once
    Stripe holds that amount (``paid_in_full`` of an authorisation), else left as it is,
    noted ``charge:<status>`` with its PaymentIntent kept (``orders.keep_payment``), a 3-D
    Secure checkout's too: an order ``authorized`` while the customer authenticates is one
    fulfilment captures, and Stripe refuses, nothing held. Stripe's webhook marks it
    ``authorized`` once it holds the amount (``handle_stripe_event``)."""
    authorization = task.outbound(
        stripe.authorize, payment_request(_read(order_id)), business_key=f"authorization:{order_id}"
    )

    def authorized(conn: Connection) -> None:
        order = orders.load(conn, order_id)
        if paid_in_full(authorization, order, authorised=True):
            orders.move(conn, order_id, "authorized", authorization["id"])
        else:
            orders.keep_payment(conn, order_id, authorization["id"])
            orders.note(
                conn, order_id, f"charge:{authorization.get('status')}", authorization["id"]
            )

    task.fenced_effect("authorized", authorized, business_key=f"authorization:{order_id}")
    return authorization


@app.task(base=PaymentTask, bind=True)
def authorize_order(self: PaymentTask, order_id: str) -> dict[str, Any]:
    return authorize(self, order_id)


@app.task(base=PaymentTask, bind=True)
def capture_shipment(
    self: PaymentTask, order_id: str, shipment: int, amount: int
) -> dict[str, Any]:
    """One capture per shipment, keyed by the authorisation and the shipment's number
    (design: PS18); shipments are the authorisation's disposition (``dispose``), so one of
    an authorisation captured whole or voided is refused. Noted ``shipping`` before it is
    sent, and a definite refusal by Stripe frees the authorisation for a whole capture or a
    void (``dispositions``). What is noted is what Stripe says it received, not asked."""
    payment_id = _read(order_id)["payment_id"]
    key = f"capture:{payment_id}:{shipment}"
    disposition = dispose(self, order_id, payment_id, "ship")
    first = disposition.action
    if first == "ship":
        first = dispositions.start_shipment(self, order_id, shipment, key, disposition)
    if first != "ship":
        return refused(self, order_id, payment_id, "ship", first, key)
    request = {"payment_id": payment_id, "amount": amount}
    send = lambda: self.outbound(stripe.capture, request, business_key=key)  # noqa: E731
    captured = dispositions.send_shipment(self, order_id, shipment, key, send)
    if captured.get("status") == "succeeded":
        entry, received = "captured", str(captured.get("amount_received"))
    else:
        entry, received = f"capture:{captured.get('status')}", str(captured["id"])
    self.fenced_effect(
        "captured", lambda conn: orders.note(conn, order_id, entry, received), business_key=key
    )
    return captured


@app.task(base=PaymentTask, bind=True)
def settle_authorization(self: PaymentTask, order_id: str, action: str) -> dict[str, Any]:
    """Capture (fulfilment) or void (the customer cancelled): one disposition per
    authorisation, recorded before either is sent (design: PS20), the checkout's capture
    and shipments deciding through it too. The loser takes the other route: a cancel after
    the capture becomes a refund. The order is ``captured`` only when Stripe took its
    amount, ``voided`` only when the PaymentIntent is ``canceled``; otherwise it is left as
    it is, noted ``capture:<status>`` or ``void:<status>``. A capture Stripe refuses
    (nothing held: the customer had not finished 3-D Secure) is noted
    ``disposition:capture:refused`` and raised; it frees the authorisation, so a later
    capture or void goes ahead in the disposition's next round (``dispose``)."""
    if action not in ("capture", "void"):
        raise ValueError(f"settle an authorisation by capture or void, not {action!r}")
    payment_id = _read(order_id)["payment_id"]
    first, key = dispose(self, order_id, payment_id, action, noted=True)
    while first == "capture" and action == "void":
        refunded = _refund_the_capture(self, order_id, payment_id, key)
        if refunded is not None:
            return refunded
        first, key = dispose(self, order_id, payment_id, action, noted=True)  # next round
    if first != action:
        return refused(self, order_id, payment_id, action, first, key)
    if action == "capture":
        done = _capture(self, order_id, payment_id, key)
    else:
        done = self.outbound(stripe.void, {"payment_id": payment_id}, business_key=key)
    status = "captured" if action == "capture" else "voided"

    def settled(conn: Connection) -> bool:
        # Stripe answers a capture with the PaymentIntent: captured only once it took the
        # order's amount (``paid_in_full``), voided only once it is canceled.
        if action == "capture":
            done_at_stripe = paid_in_full(done, orders.load(conn, order_id))
        else:
            done_at_stripe = done.get("status") == "canceled"
        if not done_at_stripe:
            orders.note(conn, order_id, f"{action}:{done.get('status')}", done["id"])
            return False
        return orders.move(conn, order_id, status)

    self.fenced_effect(status, settled, business_key=key)
    return done


def _capture(task: PaymentTask, order_id: str, payment_id: str, key: str) -> dict[str, Any]:
    """The authorisation's whole capture under the disposition round's ``key``; a definite
    refusal by Stripe is noted (``dispositions.send_whole_capture``) and raised."""
    send = lambda: task.outbound(stripe.capture, {"payment_id": payment_id}, business_key=key)  # noqa: E731
    return dispositions.send_whole_capture(task, order_id, key, send)


def _refund_the_capture(
    task: PaymentTask, order_id: str, payment_id: str, key: str
) -> dict[str, Any] | None:
    """A cancel that lost to the capture (fulfilment's or the checkout's) becomes a refund,
    of money the capture took. The capture may not be sent yet: the same call under the
    same key waits for it (or sends it, once), so the refund never precedes it. Its answer
    decides, by the capture route's rule (``paid_in_full``): a capture still
    ``processing``, or short, took no order's amount to give back, and a refund then
    returns money never captured, or another amount. So that is noted
    ``cancelled:capture:<status>`` for a person, nothing sent. A capture Stripe refused
    took nothing: None, and the cancel decides again, in the next round (a void)."""
    try:
        captured = _capture(task, order_id, payment_id, key)
    except Exception as exc:
        if is_definite_stripe_failure(exc):
            return None  # noted: ``dispose`` now skips this round
        raise

    def taken(conn: Connection) -> bool:
        if paid_in_full(captured, orders.load(conn, order_id)):
            return True
        orders.note(conn, order_id, f"cancelled:capture:{captured.get('status')}", captured["id"])
        return False

    if not task.fenced_effect("cancelled", taken, business_key=key):
        return {"not_refunded": captured.get("status")}
    return {"refunded": refund(task, order_id, payment_id)["id"]}


def own_payment(order: Mapping[str, Any], intent: Mapping[str, Any]) -> bool:
    """Whether the PaymentIntent (as Stripe shows it, with its metadata) is the order's
    own: the one it stored, or, before it stored one, one the shop created for the order
    (``SHOP_CHARGE`` names it). Another PaymentIntent carries the same reference (a
    duplicate, an older attempt made elsewhere): its refund returned none of the order's
    payment, and its success is money to give back. Nothing stored and nothing noted is
    no proof of "never charged": the shop's own charge may be in flight (sent, its answer
    not yet written, its worker dead), and a duplicate then marked the order paid by money
    a person must refund."""
    if order["payment_id"]:
        return bool(order["payment_id"] == intent["id"])
    return bool((intent.get("metadata") or {}).get(SHOP_CHARGE) == order["id"])


@app.task(base=PaymentTask, bind=True)
def handle_stripe_event(self: PaymentTask, message: dict[str, Any]) -> Any:
    """A webhook's event, applied once under ``event:stripe:<id>`` (design: PS15), and only
    ever moving the order forward to what Stripe says now (design: PS16): paid only by a
    PaymentIntent that took the order's amount in its currency (``paid_in_full``), and
    only by the order's own (``own_payment``). An event about another PaymentIntent of the
    order moves nothing and is noted ``webhook:other-payment`` for a person to look at."""
    event = WebhookEvent.from_message(message)
    payment_id = (
        event.payload.get("data", {}).get("object", {}).get("payment_intent") or event.object_id
    )
    shown = stripe.client.v1.payment_intents.retrieve(payment_id).to_dict()
    intent = intent_result(shown)
    order_id = intent["reference"]
    order = _read(order_id)
    # Listed refunds are not money returned: only succeeded ones of the order's amount count.
    page = stripe.client.v1.refunds.list(params={"payment_intent": payment_id, "limit": 100})
    refunds = [refund_result(refund.to_dict()) for refund in page.auto_paging_iter()]
    if refunded_in_full(refunds, order):
        status = "refunded"
    elif paid_in_full(intent, order):
        status = "paid"
    elif paid_in_full(intent, order, authorised=True):
        status = "authorized"
    else:
        status = "new"

    def apply(conn: Connection) -> bool:
        orders.note(conn, order_id, f"webhook:{event.type}", event.event_id)
        if not own_payment(orders.load(conn, order_id), shown):
            # A second payment of the order: refund it in Stripe's dashboard if it took money.
            orders.note(conn, order_id, "webhook:other-payment", intent["id"])
            return False
        entries = orders.entries(conn, order_id)
        if status == "paid" and any(entry.startswith(SAGA_WAITS) for entry, _ in entries):
            # A saga waits for this charge (``place_order``): this event answered its wait,
            # and the saga marks the order paid once it reserved the goods, or refunds.
            return False
        cancelled = any(entry.startswith("cancelled:capture:") for entry, _ in entries)
        if cancelled and status == "paid":
            # The customer cancelled, and the capture that won the race had not taken the
            # money when the void fell back (``cancelled:capture:<status>``): it has now.
            # Never ``paid`` (to be shipped): a person refunds it.
            orders.note(conn, order_id, "cancelled:captured-later", intent["id"])
            return False
        return orders.move(conn, order_id, status, intent["id"])

    return record_event(self, event, apply).result
