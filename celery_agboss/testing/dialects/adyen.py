"""The Adyen dialect of ``FakeGatewayServer``: enough of Checkout API v72 for the
official ``Adyen`` Python SDK to run against the fake unmodified.

Adyen is named only to identify its public API; these notes are not affiliated with
or endorsed by Adyen.

What it speaks (every route under ``/v72``, each taking the ``Idempotency-Key`` header
as the fake's key):

- ``POST /payments``: ``captureDelayHours: 0`` charges now; without it, or with
  ``additionalData.manualCapture: "true"``, the payment is only authorised (the fake's
  merchant account is set to manual capture). A refusal is a 200 with
  ``resultCode: "Refused"``, as Adyen answers one, kept under its key like any first
  answer (Adyen: "If the Adyen payments platform already processed the request, the
  response to the first attempt will be returned", API idempotency page): a resend gets
  the same refusal, even once the card would pay.
- ``POST /payments/{paymentPspReference}/captures``, ``/refunds``, ``/cancels``:
  Adyen answers these 201 ``status: "received"`` and tells the outcome later by
  webhook. The fake applies the modification at once and still answers "received", so
  an adapter never learns more from the answer than Adyen would tell it. A capture or
  refund in another currency than the payment's is answered "received" too and applied
  to nothing: Adyen checks it after its answer ("The ``currency`` must match the currency
  used in authorisation", PaymentCaptureRequest and PaymentRefundRequest) and fails it by
  webhook, reason "Modification in different currency than authorisation";
  :attr:`AdyenDialect.failed_modifications` lists those the fake failed so (each in the
  gateway's ``requests``, ``INVALID``; a repeat under its key ``REPLAYED``).
  (A cancel of a captured payment, or more than is left, is still refused with a 422.)
- No payment lookup: Checkout v72 has no GET for a payment, so none is served.

Every pspReference the fake answers is 16 letters and digits, as Adyen's
(:func:`psp_reference_of` a payment, refund or modification the fake made).

Errors come in Adyen's JSON shape ``{"status", "errorCode", "message", "errorType",
"pspReference"}``, with the statuses the SDK turns into its own exceptions: a request
under a key whose first request is still being processed gets Adyen's 422 with
``errorCode "704"``; a failure before processing a 500. Codes 704 and 703 are Adyen's
documented idempotency codes; the validation codes are representative of Adyen's.

Amounts travel in Adyen's minor units ("Currency codes and minor units": CLP and ISK
with two decimals, CVE and IDR with none, unlike ISO 4217: ``wire_units.ADYEN``) while
the fake keeps ISO 4217 minor units; a value the fake cannot keep (a fraction of a
whole CLP or ISK) is refused with a 422 ``"137"``, before anything is processed.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

from celery_agboss.testing.dialects.wire_units import ADYEN
from celery_agboss.testing.gateway_requests import DECLINED, answered_here
from celery_agboss.testing.gateway_server import FakeGatewayServer, GatewayCall, Reply, Sends
from celery_agboss.testing.gateway_types import (
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayTimeout,
    GatewayCapabilities,
    GatewayRequestOutcome,
    MoneyRequest,
)

API_VERSION = "v72"
KEY_HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 64  # Adyen refuses a longer key; an adapter must send a digest
SEVEN_DAYS = 7 * 86400.0
DECLINED_HOLDER_NAME = "DECLINED"  # Adyen's test trigger: holderName names the refusal
CURRENCY_MISMATCH = "Modification in different currency than authorisation"

# kind -> (HTTP status, errorCode, errorType); the message is the fake's own.
_ERRORS: dict[FakeGatewayErrorKind, tuple[int, str, str]] = {
    FakeGatewayErrorKind.IN_PROGRESS: (422, "704", "validation"),
    # Adyen documents no refusal of a key reused with other parameters (design: G5): a fake
    # switched to refuse one answers the one key error Adyen does document.
    FakeGatewayErrorKind.CONFLICT: (422, "704", "validation"),
    FakeGatewayErrorKind.INVALID_REQUEST: (422, "137", "validation"),
    FakeGatewayErrorKind.NOT_FOUND: (422, "167", "validation"),
}
_INTERNAL = (500, "701", "internal")  # NOT_PROCESSED and anything else


def adyen_error(status: int, code: str, message: str, kind: str, psp: str | None = None) -> Reply:
    """A reply in Adyen's error shape (also what tests use to make the fake answer one)."""
    body = {
        "status": status,
        "errorCode": code,
        "message": message,
        "errorType": kind,
        "pspReference": psp or _psp(),
    }
    return Reply(status, body)


def _psp() -> str:
    return uuid.uuid4().hex[:16].upper()


def psp_reference_of(fake_id: str) -> str:
    """The pspReference the fake answers for one of its objects (a payment, a refund, the
    request that made a capture or cancel): 16 letters and digits, the same every time."""
    return hashlib.sha256(fake_id.encode("utf-8")).hexdigest()[:16].upper()


@dataclass(frozen=True)
class FailedModification:
    """A capture or refund the fake answered "received" and applied to nothing; Adyen
    would tell it in a webhook with ``success: "false"`` and this ``reason``."""

    psp_reference: str
    payment: str  # the pspReference of the payment it named
    kind: str  # "capture" or "refund"
    reason: str


def _amount(receipt: dict[str, Any], field: str = "amount") -> dict[str, Any]:
    """A receipt's amount (ISO 4217 minor units) as Adyen's amount object, in its units."""
    currency = receipt["currency"]
    return {"value": ADYEN.to_wire(receipt[field], currency), "currency": currency}


def _taken(amount: Any) -> int | Reply:
    """An Adyen amount object's value in ISO 4217 minor units, or Adyen's 422."""
    if not isinstance(amount, dict) or not isinstance(amount.get("value"), int):
        return adyen_error(422, "100", "No amount specified", "validation")
    taken = ADYEN.from_wire(amount["value"], str(amount.get("currency", "")))
    if taken is None:
        return adyen_error(422, "137", "Invalid amount specified", "validation")
    return taken


class AdyenDialect:
    """Checkout API v72 over the server's ``FakeGateway`` (see the module docstring)."""

    name = "adyen"
    documented_capabilities: ClassVar[GatewayCapabilities] = GatewayCapabilities(
        idempotency_keys=True,  # Idempotency-Key on every POST (design: G1)
        lookup_by_key=False,  # no read API for payments in Checkout v72 (design: G2)
        reference_lookup=False,
        key_retention=SEVEN_DAYS,  # "7 to 14 days": the lowest documented value (design: G3)
        first_response_on_repeat=True,  # the first response is returned (design: G4)
        conflict_on_mismatch=False,  # not documented (design: G5)
    )

    def __init__(self) -> None:
        self._api: _CheckoutApi | None = None

    @property
    def failed_modifications(self) -> list[FailedModification]:
        """Every capture or refund failed after its "received" (see the module docstring)."""
        return [] if self._api is None else [failed for failed, _ in self._api.failed.values()]

    def install(self, server: FakeGatewayServer) -> None:
        api = self._api = _CheckoutApi(server)
        base = f"/{API_VERSION}"
        server.route("POST", f"{base}/payments", api.payments, sends=api.sent("charge"))
        for kind, endpoint, operation in (
            ("captures", api.captures, "capture"),
            ("refunds", api.refunds, "refund"),
            ("cancels", api.cancels, "void"),
        ):
            path = f"{base}/payments/{{paymentPspReference}}/{kind}"
            server.route("POST", path, endpoint, sends=api.sent(operation))


class _CheckoutApi:
    def __init__(self, server: FakeGatewayServer) -> None:
        self.server = server
        # Modifications failed after their "received", by key: that answer is replayed.
        self.failed: dict[str, tuple[FailedModification, Reply]] = {}

    def _payment_of(self, psp: str) -> str:
        """The fake's id of the payment a pspReference names (itself when none: the
        gateway then answers that there is no such payment)."""
        gateway = self.server.gateway
        made = gateway.payments + gateway.declined_payments
        return next((p["id"] for p in made if psp_reference_of(p["id"]) == psp), psp)

    def sent(self, operation: str) -> Sends:
        """What a request of ``operation`` is, for one the server records itself (refused
        before the gateway, or a modification applied to nothing)."""

        def read(call: GatewayCall) -> MoneyRequest:
            key = call.header(KEY_HEADER)
            value = None if operation == "void" else _taken(call.body.get("amount"))
            amount = value if isinstance(value, int) else None
            named = call.params.get("paymentPspReference")
            payment = None if named is None else self._payment_of(named)
            return MoneyRequest(operation, key, amount, payment)

        return read

    # --- what every request passes first --------------------------------------------

    def _refusal(self, call: GatewayCall) -> Reply | None:
        """Adyen's answer when the request is refused before anything is looked at."""
        if not (call.header("x-api-key") or call.header("authorization")):
            return adyen_error(401, "000", "HTTP Status Response - Unauthorized", "security")
        key = call.header(KEY_HEADER)
        if key is not None and len(key) > MAX_KEY_LENGTH:
            return adyen_error(
                422, "702", f"{KEY_HEADER} longer than {MAX_KEY_LENGTH} characters", "validation"
            )
        if not call.body.get("merchantAccount"):
            return adyen_error(
                422, "702", "Required field 'merchantAccount' is not provided.", "validation"
            )
        return None

    def _error(self, exc: FakeGatewayError) -> Reply:
        if isinstance(exc, FakeGatewayTimeout):
            return Reply(0, drop=True)
        status, code, kind = _ERRORS.get(exc.kind, _INTERNAL)
        return adyen_error(status, code, str(exc), kind)

    # --- POST /payments ---------------------------------------------------------------

    def payments(self, call: GatewayCall) -> Reply:
        refused = self._refusal(call)
        if refused is not None:
            return refused
        body = call.body
        key = call.header(KEY_HEADER)
        reference = body.get("reference")
        self.server.charge_arrived(call, key, reference)
        amount = body.get("amount")
        value = _taken(amount)
        if isinstance(value, Reply):
            return value
        assert isinstance(amount, dict)  # _taken refused anything else
        if not reference:
            return adyen_error(
                422, "702", "Required field 'reference' is not provided.", "validation"
            )
        method = body.get("paymentMethod")
        if not isinstance(method, dict):
            return adyen_error(
                422, "702", "Required field 'paymentMethod' is not provided.", "validation"
            )
        card = self._card(method)
        additional = body.get("additionalData") or {}
        manual = str(additional.get("manualCapture", "")).lower() == "true"
        capture = body.get("captureDelayHours") == 0 and not manual
        gateway = self.server.gateway
        seen_before = len(gateway.requests_for(key)) if key is not None else 0
        try:
            # A refusal is processed and kept under the key, as Adyen keeps its first answer.
            receipt = gateway.charge(
                value,
                key,
                currency=str(amount.get("currency", "")),
                reference=reference,
                capture=capture,
                card_declines=card in self.server.declined_cards,
                saves_declines=True,
            )
        except FakeGatewayError as exc:
            return self._error(exc)
        if receipt["status"] == DECLINED:
            if gateway.made_now(key, seen_before, GatewayRequestOutcome.DECLINED):
                self.server.is_declined_card(call, card, key, reference)  # recorded
            return self._refused(receipt)
        answer = {
            "pspReference": psp_reference_of(receipt["id"]),
            "resultCode": "Authorised",
            "amount": _amount(receipt),
            "merchantReference": receipt["reference"],
        }
        return self.server.deliver_answer(call, key, reference, Reply(200, answer))

    def _card(self, method: dict[str, Any]) -> str:
        """What ``is_declined_card`` checks: the stored method's id or the card."""
        token = (
            method.get("storedPaymentMethodId")
            or method.get("encryptedCardNumber")
            or method.get("number")
            or ""
        )
        if method.get("holderName") == DECLINED_HOLDER_NAME:
            # Adyen's own test trigger, counted as a decline of one of the server's cards.
            token = next(iter(sorted(self.server.declined_cards)), token)
        return str(token)

    @staticmethod
    def _refused(receipt: dict[str, Any]) -> Reply:
        """The 200 of a refused payment (the same body when the key replays it)."""
        return Reply(
            200,
            {
                "pspReference": psp_reference_of(receipt["id"]),
                "resultCode": "Refused",
                "refusalReason": "Refused",
                "refusalReasonCode": "2",
                "merchantReference": receipt["reference"],
                "amount": _amount(receipt),
            },
        )

    # --- modifications: 201 "received" -------------------------------------------------

    def _modification(self, call: GatewayCall, *, needs_amount: bool) -> Reply | int | None:
        """A refusal, or the amount the modification asks for (None when it takes none)."""
        refused = self._refusal(call)
        if refused is not None:
            return refused
        if not needs_amount:
            return None
        return _taken(call.body.get("amount"))

    def _received(self, call: GatewayCall, payment: str, psp: str, **extra: Any) -> Reply:
        """Adyen's 201, naming the fake's ``payment`` and ``psp`` by their pspReferences."""
        return Reply(
            201,
            {
                "merchantAccount": call.body["merchantAccount"],
                "paymentPspReference": psp_reference_of(payment),
                "pspReference": psp_reference_of(psp),
                "reference": call.body.get("reference"),
                "status": "received",
                **extra,
            },
        )

    def _in_another_currency(self, call: GatewayCall, kind: str, named: str) -> Reply | None:
        """The "received" of a capture or refund in another currency than its payment's,
        applied to nothing (see the module docstring); the same answer to its key's
        repeats. None when the gateway is to answer: the currency matches, no payment has
        that pspReference, or the key's first request is the gateway's to replay."""
        key = call.header(KEY_HEADER)
        if key is not None and key in self.failed:
            answered_here(GatewayRequestOutcome.REPLAYED)  # the key's first answer, again
            return self.failed[key][1]
        gateway = self.server.gateway
        try:
            payment = gateway.retrieve(self._payment_of(named))
        except FakeGatewayError:
            return None
        asked = str((call.body.get("amount") or {}).get("currency", ""))
        if asked.upper() == str(payment["currency"]).upper():
            return None
        if key is not None and any(r.object_id for r in gateway.requests_for(key)):
            return None
        failed = FailedModification(_psp(), named, kind, CURRENCY_MISMATCH)
        answer = {
            "merchantAccount": call.body["merchantAccount"],
            "paymentPspReference": named,
            "pspReference": failed.psp_reference,
            "reference": call.body.get("reference"),
            "status": "received",
            "amount": call.body.get("amount"),
        }
        reply = Reply(201, answer)
        self.failed[key if key is not None else failed.psp_reference] = (failed, reply)
        answered_here(GatewayRequestOutcome.INVALID)  # received, then failed: nothing moved
        return reply

    def _amount_and_payment(self, call: GatewayCall, kind: str) -> Reply | tuple[int | None, str]:
        """A capture's or refund's answer before the gateway (its refusal, or the
        "received" of one in another currency), or its amount and the payment it names:
        both kinds are checked the same way, in the same order."""
        amount = self._modification(call, needs_amount=True)
        if isinstance(amount, Reply):
            return amount
        named: str = call.params["paymentPspReference"]
        failed = self._in_another_currency(call, kind, named)
        return failed if failed is not None else (amount, named)

    def captures(self, call: GatewayCall) -> Reply:
        checked = self._amount_and_payment(call, "capture")
        if isinstance(checked, Reply):
            return checked
        amount, named = checked
        key = call.header(KEY_HEADER)
        try:
            receipt = self.server.gateway.capture(self._payment_of(named), key, amount=amount)
        except FakeGatewayError as exc:
            return self._error(exc)
        # The capture's own pspReference: from the request that made it, so a replay
        # of the key answers the same one, with the payment and amount of the key's
        # first capture (Adyen replays its first response).
        amount_answer = _amount(receipt, "amount_captured")
        return self._received(call, receipt["id"], receipt["request_id"], amount=amount_answer)

    def refunds(self, call: GatewayCall) -> Reply:
        checked = self._amount_and_payment(call, "refund")
        if isinstance(checked, Reply):
            return checked
        amount, named = checked
        try:
            refund = self.server.gateway.refund(
                self._payment_of(named),
                call.header(KEY_HEADER),
                amount=amount,
                reference=call.body.get("reference"),
            )
        except FakeGatewayError as exc:
            return self._error(exc)
        # The key's first refund, replayed as it was: its own payment (Adyen's first response).
        return self._received(call, refund["payment"], refund["id"], amount=_amount(refund))

    def cancels(self, call: GatewayCall) -> Reply:
        refused = self._modification(call, needs_amount=False)
        if isinstance(refused, Reply):
            return refused
        payment = self._payment_of(call.params["paymentPspReference"])
        try:
            receipt = self.server.gateway.void(payment, call.header(KEY_HEADER))
        except FakeGatewayError as exc:
            return self._error(exc)
        return self._received(call, receipt["id"], receipt["request_id"])


__all__ = [
    "API_VERSION",
    "CURRENCY_MISMATCH",
    "DECLINED_HOLDER_NAME",
    "AdyenDialect",
    "FailedModification",
    "adyen_error",
    "psp_reference_of",
]
