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

A whole capture Stripe definitely refused (``send_whole_capture``: the PaymentIntent did
not hold the amount yet, 3-D Secure unfinished, or no longer) took nothing either: it is
noted ``disposition:capture:refused`` and frees the authorisation the same way. Its key
has a failure recorded, never sent again, so the next route decides in the disposition's
next round (``disposition:<pi>:2``, …), under that round's key: a later capture (the
checkout's, once the customer authenticated) or the customer's void goes ahead, once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

from sqlalchemy import Connection, update

from celery_agboss import AGBoss, IdempotencyKeyConflictError, PaymentTask
from celery_agboss.adapters.stripe import is_definite_stripe_failure
from example_project import orders

DISPOSITIONS = ("capture", "void", "ship")  # whole (fulfilment, checkout), cancel, shipments
SHIPPING, SHIPMENT_REFUSED = "shipping", "shipping:refused"  # a shipment's ledger entries
TAKEN = ("disposition:capture", "disposition:void")  # a whole route went ahead after shipments
CAPTURE_REFUSED = "disposition:capture:refused"  # Stripe refused a whole capture: nothing taken


class Disposition(NamedTuple):
    """What becomes of the authorisation (``action``: capture, void or ship) and the key
    its whole capture or void is sent under: the round's (``disposition_key``)."""

    action: str
    key: str


class _Held(Exception):
    """A shipment took money or may be taking it: the whole route records nothing."""


def disposition_key(payment_id: str, round_: int = 1) -> str:
    """The authorisation's one disposition (design: PS20), and the key its whole capture
    and its void are sent under: fulfilment's, the checkout's and a cancel's refund of it.
    A round after a whole capture Stripe refused has a key of its own (``:<round>``)."""
    return f"disposition:{payment_id}" + ("" if round_ == 1 else f":{round_}")


def dispose(
    task: PaymentTask, order_id: str, payment_id: str, action: str, *, noted: bool = False
) -> Disposition:
    """Record ``action`` as what becomes of the authorisation, in the one record every
    route decides through (``noted``: ``disposition:<action>`` in the ledger with it). The
    action recorded, this one or the one recorded first for the caller to yield to, and
    the key to send under. A whole capture Stripe refused (``CAPTURE_REFUSED`` under its
    round's key) decides nothing: the next round does, whichever route records first."""
    for round_ in itertools.count(1):
        key = disposition_key(payment_id, round_)
        first = _record(task, order_id, key, action, noted)
        if first == "ship" and action != "ship":
            first = _after_shipments(task, order_id, key, action)
        if first != "capture" or not _capture_refused(task, order_id, key):
            return Disposition(first, key)
    raise AssertionError("unreachable")


def _record(task: PaymentTask, order_id: str, key: str, action: str, noted: bool) -> str:
    """One round's record: ``action``, or the action recorded first under ``key``."""

    def recorded(conn: Connection) -> str:
        if noted:
            orders.note(conn, order_id, f"disposition:{action}", key)
        return action

    try:
        task.fenced_effect("disposition", recorded, key, request={"action": action})
        return action  # recorded now, or before under the same request
    except IdempotencyKeyConflictError:
        first = task.fenced_effect("disposition", _not_there, key)  # no request: read it
    # Another action was first. A record kept from before this module (settle's only,
    # capture or void) holds no action: the other one of those, yielded to as settle did.
    return str(first) if first in DISPOSITIONS else ("void" if action == "capture" else "capture")


def _capture_refused(task: PaymentTask, order_id: str, key: str) -> bool:
    """Whether Stripe refused the whole capture sent under ``key``: nothing captured, and
    never sent again. A plain read: once noted it stays so, and a re-run that sees it
    where the first delivery did not (the capture was still in flight) goes on to the next
    round, as it should, its earlier path having moved no money."""
    with AGBoss.of(task.app).store.engine.connect() as conn:
        return (CAPTURE_REFUSED, key) in orders.entries(conn, order_id)


def _not_there(conn: Connection) -> str:
    raise LookupError("no record to read")


def _hold(conn: Connection, order_id: str) -> None:
    """Lock the order's row: a shipment's start and a whole route's go-ahead take turns."""
    table = orders.orders
    conn.execute(update(table).where(table.c.id == order_id).values(attempt=table.c.attempt))


def _after_shipments(task: PaymentTask, order_id: str, key: str, action: str) -> str:
    """Shipments were first in the round ``key``: ``action`` (a whole capture, a void)
    goes ahead, recorded once and noted ``disposition:<action>`` (its reference the round's
    key), only if every shipment noted ``shipping`` was
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
        orders.note(conn, order_id, f"disposition:{action}", key)
        return action

    try:
        return str(task.fenced_effect("after-shipments", go_ahead, key, {"action": action}))
    except _Held:
        return "ship"
    except IdempotencyKeyConflictError:
        return str(task.fenced_effect("after-shipments", _not_there, key))


def start_shipment(
    task: PaymentTask, order_id: str, shipment: int, key: str, disposition: Disposition
) -> str:
    """Noted ``shipping`` before its capture is sent, so a whole route deciding meanwhile
    waits for its answer: "ship". Or the whole route that went ahead after refused
    shipments first in the shipment's round (``_after_shipments``), for the shipment to
    yield to, nothing sent. A whole route of an earlier round (its capture refused by
    Stripe) holds nothing. A note without a reference is from before rounds: round 1's."""

    def start(conn: Connection) -> str:
        _hold(conn, order_id)
        taken = [
            entry
            for entry, ref in orders.entries(conn, order_id)
            if entry in TAKEN and ref in (disposition.key, None)
        ]
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


def send_whole_capture(
    task: PaymentTask, order_id: str, key: str, send: Callable[[], Any]
) -> dict[str, Any]:
    """The authorisation's whole capture (``send``, under the round's ``key``); a definite
    refusal by Stripe (nothing captured: the PaymentIntent did not hold the amount) is
    noted ``disposition:capture:refused`` before it is raised, freeing the authorisation
    for the next round (``dispose``): a later capture or the customer's void."""
    try:
        return dict(send())
    except Exception as exc:
        if is_definite_stripe_failure(exc):
            note = lambda conn: orders.note(conn, order_id, CAPTURE_REFUSED, key)  # noqa: E731
            task.fenced_effect("capture-refused", note, key)
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
