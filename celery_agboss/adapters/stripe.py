"""Stripe through its official SDK (``stripe`` 16): PaymentIntents and refunds as calls.

Stripe is named only to identify its public API; celery_agboss is not affiliated with
or endorsed by Stripe.

Why a customer is not charged twice: every POST carries ``call.idempotency_key`` in
the ``Idempotency-Key`` header (Stripe keeps keys at least 24 h and answers a repeat
with the first response, 500s included), and a charge carries it in its metadata too,
so reconcile can search for it. Stripe's search lags (up to an hour), so an empty
search proves nothing: inside the key's retention reconcile answers ``NotSent`` and the
resend under the same key gets the first answer back; with no key age, or past it,
``Unknown``. Captures, voids and refunds are read consistently: the PaymentIntent by
id, and its refunds listed and matched by the key in their metadata.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from celery_agboss.adapters.common import require_sdk

require_sdk("stripe", pip_extra="stripe", gateway="Stripe")

import stripe

from celery_agboss.adapters.common import (
    DEFAULT_ATTEMPT_TIMEOUT,
    DEFAULT_HTTP_TIMEOUT,
    AdapterCalls,
    CallMaker,
    PaymentFacts,
    adapter_policies,
    adopt,
    adopt_action,
    definite_verdict,
    http_timeout_seconds,
    left_before,
    refuse_another_requests_answer,
    request_facts,
)
from celery_agboss.adapters.minor_units import from_gateway, to_gateway
from celery_agboss.adapters.resends import UnprovenResends
from celery_agboss.adapters.stripe_requests import (
    KEY_METADATA,
    REFERENCE_METADATA,
    STRIPE_UNITS,
    InvalidStripeRequestError,
    id_of,
    payment_id_request,
    payment_request,
    positive_int,
    text_field,
)
from celery_agboss.core import sabotage
from celery_agboss.core.keys import fit_key
from celery_agboss.core.outbound import (
    CallContext,
    Completed,
    Lookup,
    NotSent,
    ReconcileAnswer,
    Unknown,
)
from celery_agboss.core.protections import STRIPE_RECONCILE_READS_THIS_REQUEST

KEY_RETENTION = timedelta(hours=24)
"""Stripe's idempotent-requests page: "Stripe retains keys for at least 24 hours"."""

MAX_KEY_LENGTH = 255
"""Stripe's limit on ``Idempotency-Key``; longer keys get the core's digest, never a cut."""

TEST_PAYMENT_METHOD = "pm_card_visa"
"""Stripe's test card, used by ``send`` (the checklist's charge) only."""

CARD_DATA = ("source", "payment_method_data")
"""What the policy of every call masks by default: the PaymentMethod (``source``: an id,
or card details someone passed in its place, as Stripe's Charges API takes them) and
Stripe's raw-card field (``payment_method_data``: number, expiry, CVC, holder name),
which the adapter refuses to send but would otherwise be stored."""

_COUNTED = frozenset({"succeeded", "pending", "requires_action"})  # refunds that took money


def is_definite_stripe_failure(exc: BaseException) -> bool:
    """Only answers that say nothing was processed: a decline (402), a validation error
    (400, 404), a refused key (401, 403), or a request this adapter refused to send.

    A 5xx, a 409 (the key in flight), a 429, a refused key reuse (the key's first
    request may have moved money), a dropped connection or a timeout may all hide a
    payment: unknown, so reconcile asks Stripe first.
    """
    if isinstance(exc, InvalidStripeRequestError):
        return True
    if isinstance(exc, stripe.IdempotencyError):
        return False
    if isinstance(exc, (stripe.CardError, stripe.AuthenticationError, stripe.PermissionError)):
        return True
    if isinstance(exc, stripe.InvalidRequestError):
        return exc.http_status in (400, 404)
    return False


def iso_amount(stripe_object: Mapping[str, Any], field: str = "amount") -> int | None:
    """A PaymentIntent's or a Refund's amount ``field`` in ISO 4217 minor units (Stripe
    writes ISK ×100 and MGA ÷100: ``STRIPE_UNITS``); None when it is none."""
    return from_gateway(stripe_object.get(field), stripe_object.get("currency"), STRIPE_UNITS)


def intent_result(intent: Mapping[str, Any]) -> dict[str, Any]:
    """A PaymentIntent as the JSON result charge, authorize, capture and void return;
    its amounts in ISO 4217 minor units, as the request's."""
    metadata = intent.get("metadata") or {}
    return {
        "id": intent["id"],
        "object": "payment_intent",
        "status": intent.get("status"),
        "amount": iso_amount(intent),
        "currency": intent.get("currency"),
        "amount_received": iso_amount(intent, "amount_received"),
        "amount_capturable": iso_amount(intent, "amount_capturable"),
        "capture_method": intent.get("capture_method"),
        "reference": metadata.get(REFERENCE_METADATA),
        "latest_charge": id_of(intent.get("latest_charge")),
    }


def refund_result(refund: Mapping[str, Any]) -> dict[str, Any]:
    """A Refund as the JSON result refund returns (its amount in ISO 4217 minor units)."""
    return {
        "id": refund["id"],
        "object": "refund",
        "status": refund.get("status"),
        "amount": iso_amount(refund),
        "currency": refund.get("currency"),
        "payment_intent": id_of(refund.get("payment_intent")),
    }


def intent_facts(intent: Mapping[str, Any]) -> PaymentFacts:
    """What tells a PaymentIntent from another: amount (in ISO 4217 minor units, as the
    request's), currency, reference and our key."""
    metadata = intent.get("metadata") or {}
    return PaymentFacts(
        amount=iso_amount(intent),
        currency=intent.get("currency"),
        reference=metadata.get(REFERENCE_METADATA),
        key=metadata.get(KEY_METADATA),
    )


def _result_id(result: Any) -> str:
    return str(result["id"])


def _search_text(value: str) -> str:
    """A value quoted for Stripe's search query language (backslash escapes)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _resend_or_unknown(lookup: Lookup, why: str) -> NotSent | Unknown:
    """Nothing proves the attempt absent: replay the key while Stripe keeps it."""
    if lookup.key_age is None:
        return Unknown(f"{why}; the key's age is unknown, so a resend might not be replayed")
    if lookup.key_age >= KEY_RETENTION:
        return Unknown(
            f"{why}; the key is {lookup.key_age} old, past Stripe's 24 h retention, so a "
            "resend could be a second charge"
        )
    return NotSent()


def _stored_payment_id(call: CallContext, lookup: Lookup) -> str | None:
    """The payment a capture's, void's or refund's reconcile reads: the STORED request's.

    This delivery's request may be another's under the same key (two executions for one
    order, a shifted step key): reading its payment would settle the key's call with
    another payment's state (design: only the request's payment).
    """
    request = lookup.request
    if sabotage.active(STRIPE_RECONCILE_READS_THIS_REQUEST):
        request = call.request
    payment_id = request.get("payment_id") if isinstance(request, Mapping) else None
    return payment_id if isinstance(payment_id, str) and payment_id else None


class StripeAdapter(AdapterCalls):
    """Stripe's money-moving calls as ``OutboundCall`` objects, over one ``StripeClient``.

    ``base_url`` points the SDK elsewhere (a fake, a proxy); None keeps the SDK's own
    ``https://api.stripe.com``, where the API key says test or live mode. The SDK's own
    retries are off: a retry is the engine's, after reconcile. Every call masks
    ``CARD_DATA`` in what is stored; ``mask=`` adds field paths (``"customer"``), never
    one reconcile reads (``amount``, ``currency``, ``reference``, ``payment_id``).
    """

    def __init__(
        self,
        api_key: str,
        *,
        base_url: str | None = None,
        timeout: float | timedelta = DEFAULT_HTTP_TIMEOUT,
        attempt_timeout: float | timedelta = DEFAULT_ATTEMPT_TIMEOUT,
        name: str = "stripe",
        stripe_account: str | None = None,
        mask: Iterable[str] = (),
    ) -> None:
        if not isinstance(api_key, str) or not api_key:
            raise ValueError("api_key must be the Stripe secret (or restricted) key, a str")
        self.name = name
        self.http_timeout = http_timeout_seconds(timeout, attempt_timeout)
        addresses: dict[str, str | None] = {}
        if base_url is not None:
            base = base_url.rstrip("/")
            addresses = {"api": base, "connect": base, "files": base, "meter_events": base}
        self.client = stripe.StripeClient(
            api_key,
            stripe_account=stripe_account,
            base_addresses=addresses,  # type: ignore[arg-type]
            max_network_retries=0,
            http_client=stripe.RequestsClient(timeout=self.http_timeout),
        )
        verdict = definite_verdict(is_definite_stripe_failure)
        call = CallMaker(name, KEY_RETENTION, verdict, MAX_KEY_LENGTH, transaction_id=_result_id)
        # A payment's NotSent rests on a search that lags: on its resend only a decline (402,
        # the key's answer) stays definite. An action's NotSent follows a consistent read.
        resent = UnprovenResends("Stripe", verdict, (stripe.CardError,))
        payments, actions = adapter_policies(CARD_DATA, mask)
        charge, authorize = resent(self._send_charge), resent(self._send_authorize)
        self.charge = call("charge", charge, self._reconcile_payment, payments)
        self.authorize = call("authorize", authorize, self._reconcile_payment, payments)
        self.capture = call("capture", self._send_capture, self._reconcile_capture, actions)
        self.refund = call("refund", self._send_refund, self._reconcile_refund, actions)
        self.void = call("void", self._send_void, self._reconcile_void, actions)

    # --- the checklist's probes ---------------------------------------------------------

    def _checklist_request(self, amount: int, key: str) -> dict[str, Any]:
        return {
            "amount": amount,
            "currency": "usd",
            "reference": key,
            "source": TEST_PAYMENT_METHOD,
        }

    def lookup(self, idempotency_key: str) -> dict[str, Any] | None:
        """The PaymentIntent the key made (by metadata search, which lags), or None."""
        found = self._intents_with_key(fit_key(idempotency_key, MAX_KEY_LENGTH))
        if len(found) > 1:
            raise LookupError(f"{len(found)} PaymentIntents carry the key {idempotency_key!r}")
        return intent_result(found[0]) if found else None

    # --- send ----------------------------------------------------------------------------

    def _options(self, call: CallContext) -> Any:
        return {"idempotency_key": call.idempotency_key}

    def _create_intent(self, call: CallContext, *, capture: bool) -> dict[str, Any]:
        payment = payment_request(call.request)
        params: Any = {
            "amount": to_gateway(payment.amount, payment.currency, STRIPE_UNITS),
            "currency": payment.currency,
            "payment_method": payment.source,
            "confirm": True,
            "capture_method": "automatic" if capture else "manual",
            # confirm at creation with no return_url: redirect-based methods are off
            "automatic_payment_methods": {"enabled": True, "allow_redirects": "never"},
            "metadata": {
                **payment.metadata,
                KEY_METADATA: call.idempotency_key,
                REFERENCE_METADATA: payment.reference,
            },
        }
        if payment.description is not None:
            params["description"] = payment.description
        if payment.customer is not None:
            params["customer"] = payment.customer
        intent = self.client.v1.payment_intents.create(params=params, options=self._options(call))
        answered = intent.to_dict()
        wanted = PaymentFacts(
            payment.amount, payment.currency, payment.reference, call.idempotency_key
        )
        refuse_another_requests_answer(
            f"Stripe's PaymentIntent {answered.get('id')}", wanted, intent_facts(answered)
        )
        return intent_result(answered)

    def _send_charge(self, call: CallContext) -> dict[str, Any]:
        return self._create_intent(call, capture=True)

    def _send_authorize(self, call: CallContext) -> dict[str, Any]:
        return self._create_intent(call, capture=False)

    def _send_capture(self, call: CallContext) -> dict[str, Any]:
        payment_id, request = payment_id_request(
            call.request, "capture", frozenset({"payment_id", "amount"})
        )
        amount = positive_int(request, "amount", optional=True)
        params: Any = {}
        if amount is not None:
            params["amount_to_capture"] = self._stripe_amount(payment_id, amount)
        intent = self.client.v1.payment_intents.capture(
            payment_id, params=params, options=self._options(call)
        )
        return intent_result(intent.to_dict())

    def _stripe_amount(self, payment_id: str, amount: int) -> int:
        """A capture's or refund's ``amount`` (ISO 4217 minor units) in Stripe's units for
        the PaymentIntent's currency, read first (a capture or refund names none): refused
        before the capture or refund when Stripe cannot write it (``STRIPE_UNITS``)."""
        intent = self.client.v1.payment_intents.retrieve(payment_id).to_dict()
        return to_gateway(amount, str(intent.get("currency") or ""), STRIPE_UNITS)

    def _send_void(self, call: CallContext) -> dict[str, Any]:
        allowed = frozenset({"payment_id", "cancellation_reason"})
        payment_id, request = payment_id_request(call.request, "void", allowed)
        reason = text_field(request, "cancellation_reason", limit=64, optional=True)
        params: Any = {} if reason is None else {"cancellation_reason": reason}
        intent = self.client.v1.payment_intents.cancel(
            payment_id, params=params, options=self._options(call)
        )
        return intent_result(intent.to_dict())

    def _send_refund(self, call: CallContext) -> dict[str, Any]:
        allowed = frozenset({"payment_id", "amount", "reason"})
        payment_id, request = payment_id_request(call.request, "refund", allowed)
        params: Any = {
            "payment_intent": payment_id,
            "metadata": {KEY_METADATA: call.idempotency_key},
        }
        amount = positive_int(request, "amount", optional=True)
        if amount is not None:
            params["amount"] = self._stripe_amount(payment_id, amount)
        reason = text_field(request, "reason", limit=64, optional=True)
        if reason is not None:
            params["reason"] = reason
        refund = self.client.v1.refunds.create(params=params, options=self._options(call))
        return refund_result(refund.to_dict())

    # --- reconcile -----------------------------------------------------------------------

    def _intents_with_key(self, key: str) -> list[dict[str, Any]]:
        """Every PaymentIntent whose metadata carries ``key``, oldest first (search lags)."""
        query = f"metadata['{KEY_METADATA}']:{_search_text(key)}"
        page = self.client.v1.payment_intents.search(params={"query": query, "limit": 100})
        found = [intent.to_dict() for intent in page.auto_paging_iter()]
        return sorted(found, key=lambda intent: intent.get("created") or 0)

    def _reconcile_payment(self, call: CallContext, lookup: Lookup) -> ReconcileAnswer:
        """Search the key in metadata; an empty search may only be lagging."""
        found = self._intents_with_key(lookup.idempotency_key)
        # A declined one moved no money: a retry past the key's 24 h made another, and
        # only that one can be the payment.
        paid = [intent for intent in found if intent.get("status") != "requires_payment_method"]
        if len(paid) > 1:
            ids = ", ".join(str(intent["id"]) for intent in paid)
            return Unknown(f"{len(paid)} PaymentIntents carry this key ({ids})")
        if not found:
            return _resend_or_unknown(lookup, "Stripe's search found no PaymentIntent yet")
        intent = paid[0] if paid else found[-1]
        wanted = request_facts(lookup.request, lookup.idempotency_key)
        mine = adopt(f"PaymentIntent {intent['id']}", wanted, intent_facts(intent), None)
        if isinstance(mine, Unknown):
            return mine
        if intent.get("status") == "requires_payment_method":
            # A decline's answer lost: the resend gets the decline back under the key.
            return _resend_or_unknown(lookup, f"PaymentIntent {intent['id']} was declined")
        return Completed(intent_result(intent))

    def _retrieve(self, payment_id: str | None) -> dict[str, Any] | None:
        """The PaymentIntent by id (a consistent read); None when there is none."""
        if payment_id is None:
            return None
        try:
            return self.client.v1.payment_intents.retrieve(payment_id).to_dict()
        except stripe.InvalidRequestError as exc:
            if exc.http_status == 404:
                return None
            raise

    def _moved_intent(
        self, call: CallContext, lookup: Lookup, done: str, not_yet: tuple[str, str]
    ) -> dict[str, Any] | ReconcileAnswer:
        """A capture or a void moves the stored request's PaymentIntent once: the intent
        when it is ``done``; else the answer, a resend while it is still ``not_yet``."""
        intent = self._retrieve(_stored_payment_id(call, lookup))
        if intent is None:
            return Unknown("no PaymentIntent by the stored request's payment_id")
        status = intent.get("status")
        if status == done:
            return intent
        why = f"PaymentIntent {intent['id']} is {status}"
        return _resend_or_unknown(lookup, why) if status in not_yet else Unknown(why)

    def _reconcile_capture(self, call: CallContext, lookup: Lookup) -> ReconcileAnswer:
        """A PaymentIntent captures once: ``succeeded`` means the capture happened."""
        intent = self._moved_intent(call, lookup, "succeeded", ("requires_capture", "canceled"))
        if not isinstance(intent, dict):
            return intent
        # Received: the request's amount, or for "capture all" the whole authorisation.
        asked = request_facts(lookup.request).amount or iso_amount(intent)
        if asked is None:  # no whole ISO minor units: no request of ours made it
            return Unknown(f"PaymentIntent {intent['id']}'s amount is not in whole ISO units")
        wanted = PaymentFacts(amount=asked)
        found = PaymentFacts(amount=iso_amount(intent, "amount_received"))
        return adopt(f"PaymentIntent {intent['id']}", wanted, found, intent_result(intent))

    def _reconcile_void(self, call: CallContext, lookup: Lookup) -> ReconcileAnswer:
        """A PaymentIntent cancels once: ``canceled`` means the void happened."""
        intent = self._moved_intent(call, lookup, "canceled", ("requires_capture", "succeeded"))
        return Completed(intent_result(intent)) if isinstance(intent, dict) else intent

    def _reconcile_refund(self, call: CallContext, lookup: Lookup) -> ReconcileAnswer:
        """The PaymentIntent's refunds, listed (consistent), matched by the key."""
        payment_id = _stored_payment_id(call, lookup)
        if payment_id is None:
            return Unknown("the stored request has no payment_id to list refunds of")
        page = self.client.v1.refunds.list(params={"payment_intent": payment_id, "limit": 100})
        refunds = [refund.to_dict() for refund in page.auto_paging_iter()]
        key = lookup.idempotency_key
        mine = [r for r in refunds if (r.get("metadata") or {}).get(KEY_METADATA) == key]
        if len(mine) > 1:
            return Unknown(f"{len(mine)} refunds of {payment_id} carry this key")
        if mine:
            # Amounts in ISO 4217 minor units, as the request's (``mine[0]`` kept as itself).
            in_iso = {id(r): {**r, "amount": iso_amount(r)} for r in refunds}
            own = in_iso[id(mine[0])]
            counted = [in_iso[id(r)] for r in refunds if r.get("status") in _COUNTED]

            def whole() -> int | str:  # "refund all": what was left when it was made
                intent = self._retrieve(payment_id) or {}
                received = iso_amount(intent, "amount_received")
                return left_before(received, own, counted, "created")

            found, result = PaymentFacts(amount=own["amount"]), refund_result(mine[0])
            asked = request_facts(lookup.request).amount
            return adopt_action(f"refund {mine[0]['id']}", asked, whole, found, result)
        return _resend_or_unknown(lookup, f"no refund of {payment_id} carries this key")


__all__ = [
    "CARD_DATA",
    "KEY_METADATA",
    "KEY_RETENTION",
    "MAX_KEY_LENGTH",
    "REFERENCE_METADATA",
    "TEST_PAYMENT_METHOD",
    "InvalidStripeRequestError",
    "StripeAdapter",
    "intent_facts",
    "intent_result",
    "is_definite_stripe_failure",
    "refund_result",
]
