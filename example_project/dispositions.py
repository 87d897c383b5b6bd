"""What becomes of an authorisation (a PaymentIntent): one disposition, recorded once.

Fulfilment's capture and the customer's cancel (``shop.settle_authorization``), the
checkout's capture (``shop.checkout_3ds``, ``shop.capture_retried_checkout``) and
shipments' captures (``shop.capture_shipment``) each decide through the one record
``dispose`` keeps per authorisation (design: PS20): whichever records first wins, and
the other takes the loser's route, never a second capture of the PaymentIntent, nor a
capture of one the customer cancelled.

Shipments hold the authorisation only while one took money or may be taking it: each
notes ``shipping`` before it sends and ``shipping:refused`` when Stripe definitely refused
it, so a whole capture or a cancel after nothing but refused shipments goes ahead
(``_after_shipments``), once, and shipments after it are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, update

from celery_agboss import IdempotencyKeyConflictError, PaymentTask
from celery_agboss.adapters.stripe import is_definite_stripe_failure
from example_project import orders

DISPOSITIONS = ("capture", "void", "ship")  # whole (fulfilment, checkout), cancel, shipments
SHIPPING, SHIPMENT_REFUSED = "shipping", "shipping:refused"  # a shipment's ledger entries
TAKEN = ("disposition:capture", "disposition:void")  # a whole route went ahead after shipments


class _Held(Exception):
    """A shipment took money or may be taking it: the whole route records nothing."""


def disposition_key(payment_id: str) -> str:
    """The authorisation's one disposition (design: PS20), and the key its whole capture
    and its void are sent under: fulfilment's, the checkout's and a cancel's refund of it."""
    return f"disposition:{payment_id}"


def dispose(
    task: PaymentTask, order_id: str, payment_id: str, action: str, *, noted: bool = False
) -> str:
    """Record ``action`` as what becomes of the authorisation, in the one record every
    route decides through (``noted``: ``disposition:<action>`` in the ledger with it). The
    action recorded: this one, or the one recorded first, for the caller to yield to."""

    def recorded(conn: Connection) -> str:
        if noted:
            orders.note(conn, order_id, f"disposition:{action}")
        return action

    key = disposition_key(payment_id)
    try:
        task.fenced_effect("disposition", recorded, key, request={"action": action})
        return action  # recorded now, or before under the same request
    except IdempotencyKeyConflictError:
        first = task.fenced_effect("disposition", _not_there, key)  # no request: read it
    if first == "ship":
        return _after_shipments(task, order_id, payment_id, action)
    # Another action was first. A record kept from before this module (settle's only,
    # capture or void) holds no action: the other one of those, yielded to as settle did.
    return str(first) if first in DISPOSITIONS else ("void" if action == "capture" else "capture")


def _not_there(conn: Connection) -> str:
    raise LookupError("no record to read")


def _hold(conn: Connection, order_id: str) -> None:
    """Lock the order's row: a shipment's start and a whole route's go-ahead take turns."""
    table = orders.orders
    conn.execute(update(table).where(table.c.id == order_id).values(attempt=table.c.attempt))


def _after_shipments(task: PaymentTask, order_id: str, payment_id: str, action: str) -> str:
    """Shipments were first: ``action`` (a whole capture, a void) goes ahead, recorded once
    and noted ``disposition:<action>``, only if every shipment noted ``shipping`` was
    refused by Stripe: none noted yet may still send, and a ``captured`` or any other
    answer may have taken money. Otherwise "ship", nothing recorded, so a later try
    decides again. A later whole route yields to the one that went ahead: a void to the
    capture (its refund), a capture to the void."""

    def go_ahead(conn: Connection) -> str:
        _hold(conn, order_id)
        entries = orders.entries(conn, order_id)
        started = {ref for entry, ref in entries if entry == SHIPPING}
        refused = {ref for entry, ref in entries if entry == SHIPMENT_REFUSED}
        moved = any(entry == "captured" or entry.startswith("capture:") for entry, _ in entries)
        if moved or not started <= refused or not started:
            raise _Held  # rolled back: nothing recorded
        orders.note(conn, order_id, f"disposition:{action}")
        return action

    key = disposition_key(payment_id)
    try:
        return str(task.fenced_effect("after-shipments", go_ahead, key, {"action": action}))
    except _Held:
        return "ship"
    except IdempotencyKeyConflictError:
        return str(task.fenced_effect("after-shipments", _not_there, key))


def start_shipment(task: PaymentTask, order_id: str, shipment: int, key: str) -> str:
    """Noted ``shipping`` before its capture is sent, so a whole route deciding meanwhile
    waits for its answer: "ship". Or the whole route that went ahead after refused
    shipments first (``_after_shipments``), for the shipment to yield to, nothing sent."""

    def start(conn: Connection) -> str:
        _hold(conn, order_id)
        taken = [entry for entry, _ in orders.entries(conn, order_id) if entry in TAKEN]
        if taken:
            return taken[0].partition(":")[2]
        orders.note(conn, order_id, SHIPPING, str(shipment))
        return "ship"

    return str(task.fenced_effect("shipping", start, key))


def send_shipment(
    task: PaymentTask, order_id: str, shipment: int, key: str, send: Callable[[], Any]
) -> dict[str, Any]:
    """The shipment's capture (``send``); a definite refusal by Stripe (nothing captured)
    is noted ``shipping:refused`` before it is raised, freeing the authorisation."""
    try:
        return dict(send())
    except Exception as exc:
        if is_definite_stripe_failure(exc):
            note = lambda conn: orders.note(conn, order_id, SHIPMENT_REFUSED, str(shipment))  # noqa: E731
            task.fenced_effect("shipping-refused", note, key)
        raise


def refused(
    task: PaymentTask, order_id: str, payment_id: str, action: str, first: str, key: str
) -> dict[str, Any]:
    """``action`` lost to the disposition recorded ``first``: nothing sent. A shipment's
    capture and a whole capture or a cancel that meet (Stripe captures a PaymentIntent
    once) are noted ``refused:<action>:<first>`` for a person to settle what is owed."""
    if "ship" in (action, first):
        entry = f"refused:{action}:{first}"
        task.fenced_effect(
            f"refused-{action}", lambda conn: orders.note(conn, order_id, entry, payment_id), key
        )
    why = {
        "void": "the order was cancelled",
        "ship": "a shipment was captured, or is being captured,",
    }
    answer = "not_voided" if action == "void" else "not_captured"
    return {answer: why.get(first, "the authorisation was captured whole") + " first"}
