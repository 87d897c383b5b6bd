"""What becomes of an authorisation (a PaymentIntent): one disposition, recorded once.

Fulfilment's capture and the customer's cancel (``shop.settle_authorization``), the
checkout's capture (``shop.checkout_3ds``, ``shop.capture_retried_checkout``) and
shipments' captures (``shop.capture_shipment``) each decide through the one record
``dispose`` keeps per authorisation (design: PS20): whichever records first wins, and
the other takes the loser's route, never a second capture of the PaymentIntent, nor a
capture of one the customer cancelled.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from celery_agboss import IdempotencyKeyConflictError, PaymentTask
from example_project import orders

DISPOSITIONS = ("capture", "void", "ship")  # whole (fulfilment, checkout), cancel, shipments


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

    def not_there(conn: Connection) -> str:
        raise LookupError(f"no disposition of {payment_id} to read")

    key = disposition_key(payment_id)
    try:
        task.fenced_effect("disposition", recorded, key, request={"action": action})
        return action  # recorded now, or before under the same request
    except IdempotencyKeyConflictError:
        first = task.fenced_effect("disposition", not_there, key)  # no request: read it
    # Another action was first. A record kept from before this module (settle's only,
    # capture or void) holds no action: the other one of those, yielded to as settle did.
    return str(first) if first in DISPOSITIONS else ("void" if action == "capture" else "capture")


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
    why = {"void": "the order was cancelled", "ship": "a shipment was captured"}
    answer = "not_voided" if action == "void" else "not_captured"
    return {answer: why.get(first, "the authorisation was captured whole") + " first"}
