"""The PayPal dialect of ``FakeGatewayServer``: OAuth, Orders v2 and Payments v2.

Enough of PayPal's REST API for the official ``paypal-server-sdk`` to run unmodified,
every money-moving call keyed by ``PayPal-Request-Id``, errors in PayPal's own shape
(``{"name", "message", "debug_id", "details": [{"issue", "description"}]}``) so the SDK
raises its ``ErrorException``/``ApiException``. An order created without a payment source
is kept here and moves no money; capturing one is ``gateway.charge(capture=True)``,
authorizing one ``charge(capture=False)``, under the request's key, paid by the vaulted
``payment_source`` in that request's body. An order created WITH a vaulted source is paid
at once, as PayPal may do (captured for intent CAPTURE, authorized for AUTHORIZE), under
the create's own ``PayPal-Request-Id``. Captures of authorizations (several, until one
is ``final_capture``), voids and refunds are the fake's (``paypal_payments``). Amounts
are minor units in the fake and PayPal's decimal strings on the wire (whole units for
HUF, JPY and TWD: ``paypal_wire``). As PayPal documents: a repeat answers the CURRENT
state of what the first request made, a repeat with other parameters is not refused, and
an order's key lives 6 h (here: the fake's ``key_retention`` and ``idempotency_keys``, on
its clock). Every capture or authorize of an order, and every create with a vaulted
source, is a charge in the fake's ``requests``, the ones answered here too: a repeat under
the key that paid (``REPLAYED``), 422 ``ORDER_ALREADY_CAPTURED``, ``ORDER_NOT_APPROVED``
(an order no payer approved, captured without a source) and ``ACTION_DOES_NOT_MATCH_INTENT``
(``INVALID``, no key kept) and 409 ``PREVIOUS_REQUEST_IN_PROGRESS`` (``IN_PROGRESS``) move
no money; a declined instrument is declined by the fake (``DECLINED``); one refused
before it reached the order (no token: ``INVALID``) or answered by ``answer_next``
(``CANNED``) is recorded too.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from celery_agboss.testing.dialects.canned import CannedReplies
from celery_agboss.testing.dialects.paypal_payments import PayPalPayments, gateway_error
from celery_agboss.testing.dialects.paypal_wire import (
    WHOLE_UNIT_CURRENCIES,
    from_value,
    iso,
    not_found,
    paypal_error,
    to_value,
    value_issue,
)
from celery_agboss.testing.gateway_server import (
    Endpoint,
    FakeGatewayServer,
    GatewayCall,
    Reply,
    Sends,
)
from celery_agboss.testing.gateway_types import (
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayTimeout,
    GatewayCapabilities,
    MoneyRequest,
)

ORDER_KEY_RETENTION = 6 * 3600.0
"""Orders v2 keeps a ``PayPal-Request-Id`` 6 hours (its API spec and its SDK say so)."""

Body = dict[str, Any]


def _vault_id(body: Body) -> str | None:
    """The vault id of a body's ``payment_source`` (``card`` or ``paypal``); None without one."""
    source = body.get("payment_source")
    found = source.values() if isinstance(source, dict) else ()
    vault = next((s.get("vault_id") for s in found if isinstance(s, dict)), None)
    return vault if isinstance(vault, str) and vault else None


@dataclass
class PayPalOrder:
    """An order as this dialect keeps it; ``payment_id`` is the fake's charge once paid."""

    id: str
    intent: str  # "CAPTURE" or "AUTHORIZE"
    amount: int
    currency: str  # PayPal's upper-case code
    reference: str | None  # the purchase unit's custom_id
    source: str | None  # the payment source's vault id: with one, the order is approved
    request_id: str | None
    created: float
    payment_id: str | None = None
    payment_key: str | None = None  # the PayPal-Request-Id that captured/authorized it
    paid_at: float = 0.0
    paid_at_creation: bool = False  # created with a vaulted source, and paid by that call
    charged_at_creation: bool = False  # created with a vaulted source: the create charged


@dataclass
class _State:
    orders: dict[str, PayPalOrder] = field(default_factory=dict)
    order_keys: dict[str, str] = field(default_factory=dict)  # PayPal-Request-Id -> order id
    order_of_payment: dict[str, str] = field(default_factory=dict)
    paying: dict[str, str | None] = field(default_factory=dict)  # order id -> its payment's key
    tokens: set[str] = field(default_factory=set)
    canned: CannedReplies = field(default_factory=CannedReplies)


class PayPalDialect:
    """PayPal's REST API over the server's ``FakeGateway`` (see the module docstring)."""

    name = "paypal"
    documented_capabilities: ClassVar[GatewayCapabilities] = GatewayCapabilities(
        idempotency_keys=True,  # PayPal-Request-Id on every money-moving call
        lookup_by_key=True,  # replay the order's key, then GET /v2/checkout/orders/{id}
        key_retention=ORDER_KEY_RETENTION,  # the lowest: orders 6 h (payments v2: 45 days)
        first_response_on_repeat=False,  # "the latest status", not the original response
        conflict_on_mismatch=False,  # not documented
        reference_lookup=False,  # no search by invoice_id or custom_id
        replays_failures=False,
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = _State()
        self._server: FakeGatewayServer | None = None
        self._payments: PayPalPayments | None = None

    def install(self, server: FakeGatewayServer) -> None:
        self._server = server
        payments = self._payments = PayPalPayments(server)
        server.route("POST", "/v1/oauth2/token", self._guarded(self._token, token=True))
        order, authorization = "/v2/checkout/orders/{id}", "/v2/payments/authorizations/{id}"
        paying, sent = self._order_sent, payments.sent
        routes: list[tuple[str, str, Endpoint, Sends | None]] = [
            ("POST", "/v2/checkout/orders", self._create_order, paying),
            ("GET", order, self._get_order, None),
            ("POST", f"{order}/capture", self._pay_order, paying),
            ("POST", f"{order}/authorize", self._pay_order, paying),
            ("GET", authorization, payments.get_authorization, None),
            ("POST", f"{authorization}/capture", payments.capture_authorization, sent("capture")),
            ("POST", f"{authorization}/void", payments.void, sent("void")),
            ("GET", "/v2/payments/captures/{id}", payments.get_capture, None),
            ("POST", "/v2/payments/captures/{id}/refund", payments.refund, sent("refund")),
        ]
        for method, path, endpoint, sends in routes:
            server.route(method, path, self._guarded(endpoint), sends=sends)

    # --- what a test reads and arms ----------------------------------------------------------

    @property
    def orders(self) -> list[PayPalOrder]:
        """Every order made, oldest first (copies)."""
        with self._lock:
            return [replace(order) for order in self._state.orders.values()]

    def answer_next(
        self, status: int, body: Any = None, *, path: str | None = None, times: int = 1
    ) -> None:
        """Answer the next ``times`` requests (whose path ends with ``path``, or any) with
        ``status`` and ``body`` (default: PayPal's error body for the status), before
        anything is processed: any status or error body PayPal documents, on demand."""
        reply = paypal_error(status) if body is None else Reply(status, body)
        matches = None if path is None else (lambda called: called.endswith(path))
        self._state.canned.arm(reply, matches, times)

    def status_next(self, operation: str, status: str, *, times: int = 1) -> None:
        """Answer the next ``times`` captures of an authorization or refunds
        (``operation``: "capture" or "refund") 201 with ``status``, as PayPal may: a capture
        DECLINED or FAILED, a refund FAILED or CANCELLED moves no money (kept under the
        key, replayed to a repeat); PENDING moves it and shows PENDING."""
        self.payments.status_next(operation, status, times)

    def forget_keys(self) -> None:
        """Drop every order's key, as PayPal does after 6 h (``FakeGateway.forget_keys``
        drops the payments' keys)."""
        with self._lock:
            self._state.order_keys.clear()

    # --- plumbing ------------------------------------------------------------------------------

    @property
    def server(self) -> FakeGatewayServer:
        if self._server is None:
            raise RuntimeError("the PayPal dialect is not installed on a server")
        return self._server

    @property
    def payments(self) -> PayPalPayments:
        if self._payments is None:
            raise RuntimeError("the PayPal dialect is not installed on a server")
        return self._payments

    def _guarded(self, endpoint: Endpoint, *, token: bool = False) -> Endpoint:
        """A canned answer first; then the bearer token every API call needs."""

        def serve(call: GatewayCall) -> Reply:
            canned = self._state.canned.take(call.path)
            if canned is not None:
                return canned
            with self._lock:
                scheme, _, bearer = (call.header("Authorization") or "").partition(" ")
                authorized = scheme == "Bearer" and bearer in self._state.tokens
            if not token and not authorized:
                return paypal_error(401, None, "Authentication failed due to invalid token.")
            return endpoint(call)

        return serve

    def _token(self, call: GatewayCall) -> Reply:
        """Any client id and secret get a token (a test refuses one with ``answer_next``)."""
        scheme, _, encoded = (call.header("Authorization") or "").partition(" ")
        if scheme != "Basic" or not encoded or call.body.get("grant_type") != "client_credentials":
            return Reply(401, {"error": "invalid_client", "error_description": "Basic auth"})
        issued = f"A21AA{uuid.uuid4().hex}"
        with self._lock:
            self._state.tokens.add(issued)
        body = {"access_token": issued, "token_type": "Bearer", "expires_in": 32400}
        return Reply(200, {**body, "scope": "https://uri.paypal.com/services/payments/payment"})

    def _order_sent(self, call: GatewayCall) -> MoneyRequest | None:
        """A capture or authorize of an order, or a create that pays with a vaulted source
        (or repeats one that did), is a charge; a create without one moves no money. A
        create whose body could not be read may have paid: a charge, as it is counted."""
        key = call.header("PayPal-Request-Id")
        if "id" not in call.params and call.unreadable is not None:
            return MoneyRequest("charge", key)
        with self._lock:
            named = call.params.get("id") or self._state.order_keys.get(key or "")
            order = self._state.orders.get(named or "")
        if "id" not in call.params:  # a create
            if _vault_id(call.body) is None and not (order and order.charged_at_creation):
                return None
            units = call.body.get("purchase_units")
            unit = units[0] if isinstance(units, list) and units else None
            money = unit.get("amount") if isinstance(unit, dict) else None
            if isinstance(money, dict):
                currency = str(money.get("currency_code") or "")
                return MoneyRequest("charge", key, from_value(money.get("value"), currency))
        return MoneyRequest("charge", key, None if order is None else order.amount)

    # --- orders ----------------------------------------------------------------------------------

    def _create_order(self, call: GatewayCall) -> Reply:
        body, key, gateway = call.body, call.header("PayPal-Request-Id"), self.server.gateway
        with self._lock:
            known = self._state.order_keys.get(key) if key and gateway.idempotency_keys else None
            order = self._state.orders.get(known or "")
        if order is not None and gateway.now() - order.created < gateway.key_retention:
            return self._repeat_create(order, key)
        intent, units = body.get("intent"), body.get("purchase_units")
        if intent not in ("CAPTURE", "AUTHORIZE"):
            return paypal_error(400, "INVALID_PARAMETER_VALUE", "intent: CAPTURE or AUTHORIZE.")
        if not isinstance(units, list) or len(units) != 1 or not isinstance(units[0], dict):
            return paypal_error(400, "INVALID_ARRAY_LENGTH", "one purchase unit is supported.")
        money = units[0].get("amount") or {}
        currency = str(money.get("currency_code") or "")
        amount = from_value(money.get("value"), currency) if len(currency) == 3 else None
        if amount is None:
            issue = value_issue(money.get("value"), currency) or "INVALID_PARAMETER_VALUE"
            return paypal_error(422, issue, "amount is not valid.")
        vault = _vault_id(body)
        reference, order_id = units[0].get("custom_id"), uuid.uuid4().hex[:17].upper()
        order = PayPalOrder(
            order_id, intent, amount, currency, reference, vault, key, gateway.now()
        )
        order.charged_at_creation = vault is not None
        with self._lock:
            self._state.orders[order.id] = order
            if key:
                self._state.order_keys[key] = order.id
            if vault is not None:
                self._state.paying[order.id] = key
        if vault is None:
            return Reply(201, self._order_body(order))
        try:  # a vaulted source needs no payer's approval: PayPal may pay it right here
            return self._charge_order(call, order, key, capture=intent == "CAPTURE")
        finally:
            with self._lock:
                self._state.paying.pop(order.id, None)
                order.paid_at_creation = order.payment_id is not None

    def _get_order(self, call: GatewayCall) -> Reply:
        with self._lock:
            order = self._state.orders.get(call.params["id"])
        return not_found() if order is None else Reply(200, self._order_body(self._catch_up(order)))

    def _repeat_create(self, order: PayPalOrder, key: str | None) -> Reply:
        """A repeat of a create under its key: the order as it is now (PayPal). One made
        with a vaulted source charged, so its repeat is a charge too: answered from the
        key, recorded in the gateway's ``requests`` (REPLAYED)."""
        if order.charged_at_creation:
            failed = self._charge_again(self._catch_up(order), key)
            expected = (FakeGatewayErrorKind.INVALID_REQUEST, FakeGatewayErrorKind.IN_PROGRESS)
            if failed is not None and failed.kind not in expected:
                return gateway_error(failed, "TRANSACTION_REFUSED")
        return Reply(200, self._order_body(self._catch_up(order)))

    def _pay_order(self, call: GatewayCall) -> Reply:
        """Capture or authorize an order: where the money moves, paid by the vaulted
        ``payment_source`` of this request's body (else the one the order was created with).
        A repeat, or a refusal of an order paid or being paid, reaches the gateway too
        (recorded in its ``requests``): only the first request pays."""
        wanted = "CAPTURE" if call.path.endswith("/capture") else "AUTHORIZE"
        key, gateway = call.header("PayPal-Request-Id"), self.server.gateway
        with self._lock:
            found = self._state.orders.get(call.params["id"])
        if found is None:
            return not_found()
        order = self._catch_up(found)
        issue = f"ORDER_ALREADY_{'CAPTURED' if wanted == 'CAPTURE' else 'AUTHORIZED'}"
        with self._lock:
            paid = order.payment_id is not None
            fresh = gateway.now() - order.paid_at < gateway.key_retention
            repeat = paid and fresh and bool(key) and key == order.payment_key
            source = _vault_id(call.body) or order.source
            refusal = self._not_payable(order, wanted, paid, source)
            busy = not paid and order.id in self._state.paying
            if refusal is None and not paid and not busy:
                self._state.paying[order.id] = key
                order.source = source
        if refusal is not None:  # reached the gateway: counted, nothing processed
            return self._refused(order, key, 422, *refusal)
        if repeat and gateway.idempotency_keys:
            failed = self._charge_again(order, key)
            if failed is None:
                return Reply(200, self._order_body(order))
            if failed.kind is not FakeGatewayErrorKind.INVALID_REQUEST:
                return gateway_error(failed, "TRANSACTION_REFUSED")
            return paypal_error(422, issue, "The order was already paid.")  # key forgotten
        if paid:
            return self._refused(order, key, 422, issue, "The order was already paid.")
        if busy:
            return self._refused(order, key, 409, "PREVIOUS_REQUEST_IN_PROGRESS", "Being paid.")
        try:
            return self._charge_order(call, order, key, capture=wanted == "CAPTURE")
        finally:
            with self._lock:
                self._state.paying.pop(order.id, None)

    @staticmethod
    def _not_payable(
        order: PayPalOrder, wanted: str, paid: bool, source: str | None
    ) -> tuple[str, str] | None:
        """PayPal's 422 (issue, description) for a capture or authorize the order refuses
        whoever sent it: the other intent's, or an order unpaid that no payer approved and
        the request names no source for. None when it may go on."""
        if order.intent != wanted:
            return "ACTION_DOES_NOT_MATCH_INTENT", f"intent {order.intent}"
        if not paid and source is None:
            return "ORDER_NOT_APPROVED", "The payer has not approved it."
        return None

    def _charge_again(self, order: PayPalOrder, key: str | None) -> FakeGatewayError | None:
        """The gateway's charge for a repeat of what ``key`` paid, as the first one was
        sent: answered from the key (REPLAYED), moving no money; refused
        (``INVALID_REQUEST``) when the key holds nothing. None when answered, else the
        failure (an armed fault's, too)."""
        paying: Body = {"currency": order.currency.lower(), "reference": order.reference}
        nothing_new = FakeGatewayError(
            FakeGatewayErrorKind.INVALID_REQUEST, "answered by the order's own key"
        )
        capture = order.intent == "CAPTURE"
        try:
            self.server.gateway.charge(
                order.amount, key, capture=capture, refuse_new=nothing_new, **paying
            )
        except FakeGatewayError as exc:
            return exc
        return None

    def _refused(
        self, order: PayPalOrder, key: str | None, status: int, issue: str, description: str
    ) -> Reply:
        """PayPal's refusal of a capture or authorization of an order paid or being paid,
        recorded in the gateway's ``requests`` (INVALID or IN_PROGRESS; nothing moved)."""
        kind = (
            FakeGatewayErrorKind.IN_PROGRESS
            if status == 409
            else FakeGatewayErrorKind.INVALID_REQUEST
        )
        refusal = FakeGatewayError(kind, description)
        try:
            self.server.gateway.refuse("charge", key, refusal, amount=order.amount)
        except FakeGatewayError as exc:
            if exc is not refusal:  # a fault armed for the next request took this one
                return gateway_error(exc, "TRANSACTION_REFUSED")
        return paypal_error(status, issue, description)

    def _charge_order(
        self, call: GatewayCall, order: PayPalOrder, key: str | None, *, capture: bool
    ) -> Reply:
        server, reference, card = self.server, order.reference, order.source or ""
        server.charge_arrived(call, key, reference)
        declining = card in server.declined_cards
        try:
            paying: Body = {"currency": order.currency.lower(), "reference": reference}
            receipt = server.gateway.charge(
                order.amount, key, capture=capture, card_declines=declining, **paying
            )
        except FakeGatewayTimeout:
            self._catch_up(order)  # processed, its answer lost: the order shows the payment
            return Reply(0, drop=True)
        except FakeGatewayError as exc:
            if declining and exc.kind is FakeGatewayErrorKind.DECLINED:
                server.is_declined_card(call, card, key, reference)  # recorded in declines
            return gateway_error(exc, "TRANSACTION_REFUSED")
        owner = self._attach(order, receipt["id"], key)
        reply = Reply(201 if owner is order else 200, self._order_body(owner))
        return server.deliver_answer(call, key, reference, reply)

    def _catch_up(self, order: PayPalOrder) -> PayPalOrder:
        """A payment the fake made for this order while its answer is held (or was lost)
        shows in the order at once, as in PayPal's own GET."""
        with self._lock:
            key = self._state.paying.get(order.id) if order.payment_id is None else None
        made = [r.object_id for r in self.server.gateway.requests_for(key)] if key else []
        if made and made[-1] is not None:
            self._attach(order, made[-1], key)
        return order

    def _attach(self, order: PayPalOrder, payment_id: str, key: str | None) -> PayPalOrder:
        """Record the order's payment. A key the fake replayed for ANOTHER order answers
        that order (PayPal: "the latest status of the previous request")."""
        with self._lock:
            owner = self._state.order_of_payment.get(payment_id)
            if owner is not None:
                return self._state.orders[owner]
            order.payment_id, order.payment_key = payment_id, key
            order.paid_at = self.server.gateway.now()
            self._state.order_of_payment[payment_id] = order.id
            return order

    # --- bodies -----------------------------------------------------------------------------

    def _order_body(self, order: PayPalOrder) -> Body:
        unit: Body = {
            "reference_id": "default",
            "amount": self.payments.money(order.amount, order.currency),
        }
        if order.reference is not None:
            unit["custom_id"] = order.reference
        status = "APPROVED" if order.source else "CREATED"
        payment = self.payments.payment(order.payment_id) if order.payment_id else None
        if payment is not None:
            status, unit["payments"] = "COMPLETED", self._payments_of(order, payment)
        body = self.payments.resource("checkout/orders", order.id, status, order.created)
        body.update(
            intent=order.intent,
            purchase_units=[unit],
            update_time=iso(order.paid_at or order.created),
        )
        return body

    def _payments_of(self, order: PayPalOrder, payment: Body) -> Body:
        payments: Body = {}
        bodies = self.payments
        if order.intent == "AUTHORIZE":
            payments["authorizations"] = [bodies.authorization(payment)]
        captures = bodies.captures_of(payment)
        if captures:
            payments["captures"] = captures
        refunds = [r for r in self.server.gateway.refunds if r["payment"] == payment["id"]]
        if refunds:
            payments["refunds"] = [bodies.refund_body(r) for r in refunds]
        return payments


__all__ = [
    "ORDER_KEY_RETENTION",
    "WHOLE_UNIT_CURRENCIES",
    "PayPalDialect",
    "PayPalOrder",
    "from_value",
    "paypal_error",
    "to_value",
]
