"""The Checkout.com dialect of ``FakeGatewayServer``: enough of its payments API for the
official ``checkout-sdk`` to run against the fake unmodified.

Checkout.com is named only to identify its public API; this fake is not affiliated
with or endorsed by it. Paths and bodies are those the SDK sends and parses:

- ``POST /payments`` (``capture`` true or false) → 201 with ``approved``; a declined
  card is a 201 too, ``approved: false`` and status ``Declined`` (nothing moved); one a
  test pends (:meth:`CheckoutDialect.pend_next`) is a 202 ``Pending``, as a payment
  awaiting 3-D Secure is (``checkout_pending``);
- ``GET /payments?reference=`` (paged by ``limit``/``skip``), ``GET /payments/{id}``
  (with ``balances`` and ``metadata``), ``GET /payments/{id}/actions``;
- ``POST /payments/{id}/captures``, ``/refunds``, ``/voids`` → 202 ``{"action_id"}``;
  one a test declines (:meth:`CheckoutDialect.decline_next`) is a 202 too, listed
  ``approved: false`` with nothing moved, its 202 kept under the key (``checkout_actions``).
  A partial capture voids the rest unless it says ``capture_type: "NonFinal"``; a capture
  with no amount takes what is left, and is listed with what it took.

``Cko-Idempotency-Key`` is the fake's key; like Checkout.com, only a processed (2xx)
answer is kept under it, so failures are never replayed. A decline is such an answer:
the declined payment is made (listed by reference and read by id as ``Declined``, its
authorization ``approved: false``) and its 201 is kept under the key, so a repeat inside
the key's retention gets that decline back, whatever card it carries, and no second
authorization is attempted (a declined card's, or an injected ``DECLINE``'s).

Errors come in Checkout.com's shape, ``{"request_id", "error_type", "error_codes"}``:
401 without a secret key, 404 for an unknown payment, 422 ``request_invalid`` for a
malformed body or an action the payment does not allow, 429 for a key whose first
request is still in flight (as the idempotency page documents), 409 for a key reused
with other parameters (only when a test turns ``conflict_on_mismatch`` on), 502 when
the fake failed before processing.
:meth:`CheckoutDialect.answer_next` makes the next request answer any status and body
(a payment or an action so answered is in the gateway's ``requests``, ``CANNED``). A
void releases what the captures left (listed with that amount, as ``total_voided``).

Amounts travel as Checkout.com writes them ("Format the amount value": the full amount,
÷1000 with the last digit 0, or ÷100, per currency: ``wire_units.CHECKOUT``; so CLP,
ISO 4217's whole pesos, travels ×100) while the fake keeps ISO 4217 minor units; an
amount it cannot take is a 422 ``amount_invalid``.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from celery_agboss.testing.dialects.canned import CannedReplies
from celery_agboss.testing.dialects.checkout_actions import ActionDeclines, captured_by
from celery_agboss.testing.dialects.checkout_pending import PendingPayments, accepted_body
from celery_agboss.testing.dialects.checkout_sends import KEY_HEADER, sent
from celery_agboss.testing.dialects.checkout_wire import (
    action_body,
    action_id,
    balances,
    checkout_id,
    error_body,
    fake_id,
    iso_time,
    request_id,
    status_of,
)
from celery_agboss.testing.dialects.wire_units import CHECKOUT
from celery_agboss.testing.gateway_server import Endpoint, FakeGatewayServer, GatewayCall, Reply
from celery_agboss.testing.gateway_types import (
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayTimeout,
    GatewayCapabilities,
    GatewayRequestOutcome,
)

_DECLINED = "declined"  # the fake gateway's status of a declined payment
_DECLINE_CODE, _DECLINE_SUMMARY = "20005", "Declined - Do Not Honour"
_DECLINED_ACTION: dict[str, Any] = {
    "approved": False,
    "response_code": _DECLINE_CODE,
    "response_summary": _DECLINE_SUMMARY,
}
_ACTION_TYPES = {"capture": "Capture", "refund": "Refund", "void": "Void"}
_CAPTURE_TYPES = ("Final", "NonFinal")  # NonFinal: the rest of the authorisation stays open
_ERROR_STATUS = {
    FakeGatewayErrorKind.NOT_FOUND: 404,
    FakeGatewayErrorKind.CONFLICT: 409,
    FakeGatewayErrorKind.IN_PROGRESS: 429,
    FakeGatewayErrorKind.INVALID_REQUEST: 422,
    FakeGatewayErrorKind.LOOKUP_UNSUPPORTED: 501,
}
_ERROR_TYPE = {
    409: "idempotency_key_conflict",
    422: "request_invalid",
    429: "too_many_requests",
    501: "not_implemented",
    502: "bad_gateway",
}
_ACTION_REFUSED = {
    "capture": "capture_not_allowed",
    "refund": "refund_not_allowed",
    "void": "void_not_allowed",
}
OPERATIONS = ("payment", "capture", "refund", "void", "get", "list", "actions")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _card_of(source: Any) -> str:
    """What ``is_declined_card`` checks: the token, the card number or the source id."""
    if not isinstance(source, dict):
        return ""
    return str(source.get("token") or source.get("number") or source.get("id") or "")


class CheckoutDialect:
    """Checkout.com's payments API over the server's one ``FakeGateway``."""

    name = "checkout"
    documented_capabilities: ClassVar[GatewayCapabilities] = GatewayCapabilities(
        idempotency_keys=True,  # Cko-Idempotency-Key on payments and their actions (design: G1)
        lookup_by_key=False,  # no read by the key itself ...
        reference_lookup=True,  # ... the lookup is GET /payments?reference= (design: G2)
        key_retention=86400.0,  # 24 h by default (an account may be set otherwise) (design: G3)
        first_response_on_repeat=True,  # for a 2xx answer only (design: G4)
        conflict_on_mismatch=False,  # not documented for payments (design: G5)
        replays_failures=False,  # "an idempotent result will not be saved" for a failure
    )

    def __init__(self) -> None:
        self._server: FakeGatewayServer | None = None
        self._lock = threading.Lock()
        self._canned = CannedReplies()
        self._declines = ActionDeclines()
        self._pending = PendingPayments()
        self._action_details: dict[str, dict[str, Any]] = {}  # key -> reference, metadata

    def install(self, server: FakeGatewayServer) -> None:
        self._server = server
        payment = self._guarded("payment", self._request_payment)
        server.route("POST", "/payments", payment, sends=sent(server, "payment"))
        server.route("GET", "/payments", self._guarded("list", self._list_payments))
        server.route("GET", "/payments/{id}", self._guarded("get", self._get_payment))
        server.route("GET", "/payments/{id}/actions", self._guarded("actions", self._actions))
        for operation in _ACTION_TYPES:
            handler = self._action_handler(operation)
            server.route(
                "POST",
                f"/payments/{{id}}/{operation}s",
                self._guarded(operation, handler),
                sends=sent(server, operation),
            )

    def answer_next(
        self, status: int, payload: Any = None, *, operation: str | None = None, times: int = 1
    ) -> None:
        """Answer the next ``times`` requests (of ``operation``, one of ``OPERATIONS``, or
        any) with this status and body, before the gateway sees them: nothing is processed."""
        if operation is not None and operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {OPERATIONS}, not {operation!r}")
        reply = Reply(status, {} if payload is None else payload)
        self._canned.arm(reply, None if operation is None else operation.__eq__, times)

    def decline_next(self, operation: str, *, times: int = 1) -> None:
        """Decline the next ``times`` captures, refunds or voids (``operation``) as
        Checkout.com does: accepted (202, kept under the key), then listed ``approved:
        false`` with a decline ``response_code``; no money moves."""
        self._declines.arm(operation, times)

    def pend_next(self, *, times: int = 1) -> None:
        """Answer the next ``times`` approved payments made as Checkout.com answers one
        awaiting 3-D Secure: 202 ``Pending`` (kept under the key), read ``Pending`` until
        :meth:`complete_pending`. The payment is made at the gateway all the same."""
        self._pending.arm(times)

    def complete_pending(self, payment_id: str) -> None:
        """The customer completed the Pending payment ``payment_id`` (``pay_…``)."""
        self._pending.complete(payment_id)

    # --- plumbing ----------------------------------------------------------------------

    @property
    def server(self) -> FakeGatewayServer:
        if self._server is None:
            raise RuntimeError("the checkout dialect is not installed on a server")
        return self._server

    def _guarded(self, operation: str, handler: Endpoint) -> Endpoint:
        def endpoint(call: GatewayCall) -> Reply:
            canned = self._canned.take(operation)
            if canned is not None:
                return canned
            authorization = call.header("Authorization") or ""
            if not authorization.startswith("Bearer sk_"):
                return Reply(401, {}, headers={"Cko-Request-Id": request_id()})
            return handler(call)

        return endpoint

    def _error(self, exc: FakeGatewayError, operation: str) -> Reply:
        if isinstance(exc, FakeGatewayTimeout):
            return Reply(0, drop=True)
        status = _ERROR_STATUS.get(exc.kind, 502)
        if status == 404:
            return Reply(404, {}, headers={"Cko-Request-Id": request_id()})
        code = (
            _ACTION_REFUSED.get(operation, "payment_invalid") if status == 422 else exc.kind.value
        )
        return Reply(status, error_body(_ERROR_TYPE[status], code.lower()))

    def _href(self, payment_id: str) -> dict[str, Any]:
        return {"self": {"href": f"{self.server.url}/payments/{payment_id}"}}

    # --- payments ----------------------------------------------------------------------

    def _request_payment(self, call: GatewayCall) -> Reply:
        body, key = call.body, call.header(KEY_HEADER)
        reference = body.get("reference")
        self.server.charge_arrived(call, key, reference)
        amount: Any = body.get("amount")
        currency: Any = body.get("currency")
        source: Any = body.get("source")
        invalid = []
        if not _positive_int(amount):
            invalid.append("amount_invalid" if "amount" in body else "amount_required")
        if not (isinstance(currency, str) and len(currency) == 3 and currency.isalpha()):
            invalid.append("currency_invalid" if "currency" in body else "currency_required")
        if not (isinstance(source, dict) and source.get("type")):
            invalid.append("source_type_required")
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            invalid.append("metadata_invalid")
        if not invalid and CHECKOUT.from_wire(amount, currency) is None:
            invalid.append("amount_invalid")  # e.g. a three-decimal amount not ending in 0
        if invalid:
            return Reply(422, error_body("request_invalid", *invalid))
        amount = CHECKOUT.from_wire(amount, currency)
        card = _card_of(source)
        gateway = self.server.gateway
        seen_before = len(gateway.requests_for(key)) if key is not None else 0
        try:
            # A decline is processed and its 201 kept under the key (2xx answers are).
            receipt = gateway.charge(
                amount,
                key,
                currency=currency.lower(),
                reference=reference,
                capture=body.get("capture", True) is not False,
                metadata=metadata,
                source=source,
                card_declines=card in self.server.declined_cards,
                saves_declines=True,
            )
        except FakeGatewayError as exc:
            return self._error(exc, "payment")
        if receipt["status"] == _DECLINED:
            if gateway.made_now(key, seen_before, GatewayRequestOutcome.DECLINED):
                self.server.is_declined_card(call, card, key, reference)  # recorded
            return Reply(201, self._declined(receipt))
        paid, now = checkout_id(receipt["id"]), GatewayRequestOutcome.PROCESSED
        if self._pending.answers(paid, gateway.made_now(key, seen_before, now)):
            reply = Reply(202, accepted_body(paid, receipt["reference"], self._href(paid)))
        else:
            reply = Reply(201, self._created(receipt))
        return self.server.deliver_answer(call, key, reference, reply)

    def _created(self, receipt: dict[str, Any]) -> dict[str, Any]:
        outcome = {
            "approved": True,
            "status": status_of(receipt),
            "auth_code": "770687",
            "response_code": "10000",
            "response_summary": "Approved",
        }
        return self._payment_answer(receipt, outcome)

    def _declined(self, receipt: dict[str, Any]) -> dict[str, Any]:
        """The 201 of a declined payment (the same body when the key replays it)."""
        outcome = {
            "approved": False,
            "status": "Declined",
            "response_code": _DECLINE_CODE,
            "response_summary": _DECLINE_SUMMARY,
        }
        return self._payment_answer(receipt, outcome)

    def _payment_answer(self, receipt: dict[str, Any], outcome: dict[str, Any]) -> dict[str, Any]:
        """A payment request's 201, approved or declined: one shape for both, so a
        decline reads as Checkout.com's does (``outcome``: its approval fields, in the
        order Checkout.com sends them)."""
        payment_id = checkout_id(receipt["id"])
        return {
            "id": payment_id,
            "action_id": action_id(receipt["request_id"]),
            "amount": CHECKOUT.to_wire(receipt["amount"], receipt["currency"]),
            "currency": receipt["currency"].upper(),
            **outcome,
            "processed_on": iso_time(receipt["created"]),
            "reference": receipt["reference"],
            "risk": {"flagged": False},
            "_links": self._href(payment_id),
        }

    def _details(self, payment: dict[str, Any]) -> dict[str, Any]:
        payment_id = checkout_id(payment["id"])
        extra = payment.get("metadata") or {}
        details = {
            "id": payment_id,
            "requested_on": iso_time(payment["created"]),
            "source": {"type": (extra.get("source") or {}).get("type", "card")},
            "amount": CHECKOUT.to_wire(payment["amount"], payment["currency"]),
            "currency": payment["currency"].upper(),
            "payment_type": "Regular",
            "reference": payment["reference"],
            "approved": payment["status"] != _DECLINED,
            "status": status_of(payment),
            "balances": balances(payment),
            "metadata": dict(extra.get("metadata") or {}),
            "risk": {"flagged": False},
            "_links": self._href(payment_id),
        }
        return self._pending.overlay(details)

    def _get_payment(self, call: GatewayCall) -> Reply:
        try:
            payment = self.server.gateway.retrieve(fake_id(call.params["id"]))
        except FakeGatewayError as exc:
            return self._error(exc, "get")
        return Reply(200, self._details(payment))

    def _list_payments(self, call: GatewayCall) -> Reply:
        reference = call.query.get("reference")
        try:
            limit = int(call.query.get("limit", "10"))
            skip = int(call.query.get("skip", "0"))
        except ValueError:
            return Reply(422, error_body("request_invalid", "paging_invalid"))
        if not reference:
            return Reply(422, error_body("request_invalid", "reference_required"))
        if not 1 <= limit <= 100 or skip < 0:
            return Reply(422, error_body("request_invalid", "paging_invalid"))
        try:
            found = self.server.gateway.lookup_by_reference(reference)
        except FakeGatewayError as exc:
            return self._error(exc, "list")
        payments = [self._details(p) for p in found if p.get("object") == "charge"]
        return Reply(
            200,
            {
                "limit": limit,
                "skip": skip,
                "total_count": len(payments),
                "data": payments[skip : skip + limit],
            },
        )

    # --- payment actions -----------------------------------------------------------------

    def _action_handler(self, operation: str) -> Endpoint:
        def handle(call: GatewayCall) -> Reply:
            return self._request_action(call, operation)

        return handle

    def _request_action(self, call: GatewayCall, operation: str) -> Reply:
        body, key = call.body, call.header(KEY_HEADER)
        amount, metadata = body.get("amount"), body.get("metadata") or {}
        if (amount is not None and not _positive_int(amount)) or not isinstance(metadata, dict):
            return Reply(422, error_body("request_invalid", f"{operation}_request_invalid"))
        if operation == "capture" and body.get("capture_type", "Final") not in _CAPTURE_TYPES:
            return Reply(422, error_body("request_invalid", "capture_type_invalid"))
        if key is not None:
            with self._lock:
                self._action_details.setdefault(
                    key, {"reference": body.get("reference"), "metadata": dict(metadata)}
                )
        payment_id = fake_id(call.params["id"])
        gateway = self.server.gateway
        if amount is not None:  # written in the payment's currency, kept in ISO 4217 units
            try:
                currency = gateway.retrieve(payment_id)["currency"]
            except FakeGatewayError as exc:
                return self._error(exc, operation)
            amount = CHECKOUT.from_wire(amount, currency)
            if amount is None:
                return Reply(422, error_body("request_invalid", "amount_invalid"))
        try:
            if self._declines.take(operation):
                reference = body.get("reference")
                answer = self._declines.perform(
                    gateway, operation, payment_id, key, amount, reference
                )
            elif operation == "capture":
                # "NonFinal" leaves the rest capturable; the default, "Final", voids it.
                final = body.get("capture_type") != "NonFinal"
                answer = gateway.capture(payment_id, key, amount=amount, final=final)
            elif operation == "refund":
                answer = gateway.refund(
                    payment_id, key, amount=amount, reference=body.get("reference")
                )
            else:
                answer = gateway.void(payment_id, key)
        except FakeGatewayError as exc:
            return self._error(exc, operation)
        # A replay is the key's first 202 as it was: its action, reference and payment
        # (a refund's or a declined action's receipt names its payment; a capture's or
        # void's is the payment).
        with self._lock:
            first = self._action_details.get(key or "", {"reference": body.get("reference")})
        paid = checkout_id(answer.get("payment") or answer["id"])
        return Reply(
            202,
            {
                "action_id": action_id(answer["request_id"]),
                "reference": first.get("reference"),
                "_links": {"payment": self._href(paid)["self"]},
            },
        )

    def _actions(self, call: GatewayCall) -> Reply:
        """The payment's actions, newest first, rebuilt from what the gateway processed
        (so an action whose answer was dropped is listed like any other)."""
        gateway = self.server.gateway
        payment_id = fake_id(call.params["id"])
        try:
            payment = gateway.retrieve(payment_id)
        except FakeGatewayError as exc:
            return self._error(exc, "actions")
        currency = payment["currency"]
        refunds = {r["id"]: r for r in gateway.refunds}
        answered = (GatewayRequestOutcome.PROCESSED, GatewayRequestOutcome.DECLINED)
        processed = [r for r in gateway.requests if r.outcome in answered]
        captured_later = any(
            r.operation == "capture"
            and r.payment_id == payment_id
            and r.outcome is GatewayRequestOutcome.PROCESSED
            for r in processed
        )
        actions: list[dict[str, Any]] = []
        for request in processed:
            if request.operation == "charge" and request.object_id == payment_id:
                first = {
                    "reference": payment["reference"],
                    "metadata": (payment.get("metadata") or {}).get("metadata") or {},
                }
                at, amount = request.at, payment["amount"]
                authorization = action_body(
                    request.request_id, "Authorization", amount, first, at, currency
                )
                if request.outcome is GatewayRequestOutcome.DECLINED:
                    authorization.update(_DECLINED_ACTION)
                actions.append(authorization)
                if payment["amount_captured"] and not captured_later:  # capture: true
                    auto = action_body(request.request_id, "Capture", amount, first, at, currency)
                    actions.append({**auto, "id": action_id(request.request_id, "c")})
            elif request.operation in _ACTION_TYPES and request.payment_id == payment_id:
                declined = self._declines.made(request.object_id)
                if request.outcome is not GatewayRequestOutcome.PROCESSED and declined is None:
                    continue  # an injected DECLINE: nothing was made
                amount = request.amount if declined is None else declined["amount"]
                if request.operation == "refund" and request.object_id in refunds:
                    amount = refunds[request.object_id]["amount"]
                elif request.operation == "capture" and declined is None:
                    amount = captured_by(gateway.captures, request)  # "all that is left"
                elif request.operation == "void" and declined is None:
                    # What the captures left: a voided payment is never captured again.
                    amount = payment["amount"] - payment["amount_captured"]
                elif amount is None:
                    amount = payment["amount"]
                with self._lock:
                    details = self._action_details.get(request.idempotency_key or "", {})
                kind = _ACTION_TYPES[request.operation]
                action = action_body(
                    request.request_id, kind, amount, details, request.at, currency
                )
                actions.append({**action, **(_DECLINED_ACTION if declined else {})})
        return Reply(200, list(reversed(actions)))


__all__ = ["KEY_HEADER", "OPERATIONS", "CheckoutDialect", "checkout_id", "error_body"]
