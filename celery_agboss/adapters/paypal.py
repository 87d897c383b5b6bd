"""PayPal through its official SDK (``paypal-server-sdk``, Orders v2 and Payments v2).

Every money-moving call carries ``PayPal-Request-Id``. PayPal keeps an order's key
6 hours and a payment's (capture of an authorization, void, refund) 45 days, and answers
a repeat with the CURRENT status of what the first request made. It has no lookup by
the key: what finds a payment is ``GET /v2/checkout/orders/{id}``, and the order id is
recovered by replaying the create-order under its key (PayPal answers the same order
while it keeps the key). So a charge is reconciled for 6 hours, then needs a person.

A charge is two requests: create the order under a key derived from ours
(:func:`order_request_id`), then capture (or authorize) it under our key itself, so the
money-moving request always carries ``call.idempotency_key``. The order is created
WITHOUT its payment source, which goes in the capture's (authorize's) body: PayPal may
pay an order created with a vaulted source in that one call, and reconcile replays the
create-order, so creating must never move money (design: sweep reconciles).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from datetime import timedelta
from functools import partial
from typing import Any

from celery_agboss.adapters.common import require_sdk

require_sdk("paypalserversdk", pip_extra="paypal", gateway="PayPal")

from apimatic_core.exceptions.auth_validation_exception import (  # type: ignore[import-untyped]
    AuthValidationException,
)
from paypalserversdk.configuration import Configuration, Environment, Server
from paypalserversdk.exceptions.api_exception import ApiException
from paypalserversdk.http.auth.o_auth_2 import ClientCredentialsAuthCredentials
from paypalserversdk.models.amount_with_breakdown import AmountWithBreakdown
from paypalserversdk.models.capture_request import CaptureRequest
from paypalserversdk.models.checkout_payment_intent import CheckoutPaymentIntent
from paypalserversdk.models.money import Money
from paypalserversdk.models.order_request import OrderRequest
from paypalserversdk.models.payment_source import PaymentSource
from paypalserversdk.models.purchase_unit_request import PurchaseUnitRequest
from paypalserversdk.models.refund_request import RefundRequest
from paypalserversdk.paypal_serversdk_client import PaypalServersdkClient

from celery_agboss.adapters.common import (
    DEFAULT_ATTEMPT_TIMEOUT,
    DEFAULT_HTTP_TIMEOUT,
    PAYMENT_KEPT,
    AdapterCalls,
    CallMaker,
    adapter_policies,
    adopt,
    definite_verdict,
    refuse_another_requests_answer,
)
from celery_agboss.adapters.common import http_timeout_seconds as _http_timeout
from celery_agboss.adapters.paypal_requests import (
    CARD_DATA,
    PayPalDeclinedError,
    PayPalRequestError,
    WantedPayment,
    body_of,
    checks,
    decimal_value,
    field_of,
    final_capture,
    keyed,
    order_facts,
    order_result,
    own_answer,
    paying_body,
    payment_request,
    payment_result,
    refused_or,
    result_facts,
    vaulted,
    wanted_facts,
)
from celery_agboss.adapters.resends import UnprovenResends
from celery_agboss.core import sabotage
from celery_agboss.core.durations import to_seconds
from celery_agboss.core.keys import fit_key
from celery_agboss.core.outbound import (
    CallContext,
    Completed,
    Lookup,
    NotSent,
    OutboundCall,
    Unknown,
)
from celery_agboss.core.protections import PAYPAL_ORDER_CREATED_WITH_SOURCE

ORDER_KEY_RETENTION = timedelta(hours=6)
"""Orders v2: "The server stores keys for 6 hours" (its SDK and API spec)."""
PAYMENTS_KEY_RETENTION = timedelta(days=45)
"""Payments v2: "The server stores keys for 45 days" (its SDK and API spec)."""
MAX_REQUEST_ID_LENGTH = 108
CHECKLIST_VAULT_ID = "agboss-checklist-vault-id"
"""The payment source ``send`` (the checklist) pays with; pass a sandbox vault id instead."""

ALREADY_DONE_ISSUES = frozenset(
    {"ORDER_ALREADY_CAPTURED", "ORDER_ALREADY_AUTHORIZED", "ORDER_COMPLETED_OR_VOIDED"}
    | {"AUTHORIZATION_ALREADY_CAPTURED", "PREVIOUSLY_VOIDED", "CAPTURE_FULLY_REFUNDED"}
    | {"DUPLICATE_REQUEST_ID", "DUPLICATE_INVOICE_ID", "PREVIOUS_REQUEST_IN_PROGRESS"}
)
"""Refusals that may mean OUR earlier attempt did it: never definite, reconcile asks."""
_NOTHING_PROCESSED = frozenset({400, 401, 403, 404, 422})
_OPEN_ORDER = frozenset({"CREATED", "APPROVED", "SAVED", "PAYER_ACTION_REQUIRED"})
_ORDER_DOMAIN = b"celery_agboss.paypal.order.v1\x00"


def order_request_id(idempotency_key: str) -> str:
    """The create-order's ``PayPal-Request-Id``: ``order-`` and the base64url SHA-256 of
    the call's key (49 characters). Deterministic, so a replay finds the same order; a
    digest, so two calls never share one and it never equals a call's own key (keys of
    the grammar hold ``:``, fitted digests are 43 characters, neither starts ``order-``)."""
    digest = hashlib.sha256(_ORDER_DOMAIN + idempotency_key.encode("utf-8")).digest()
    return "order-" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def is_definite_failure(exc: BaseException) -> bool:
    """Definite only when PayPal refused before processing: a 400/401/403/404/422 (a
    decline, validation, credentials, permissions), a failed token (the call was never
    made), or the adapter's own refusal. An "already captured" kind, a 409, a 429, a 5xx,
    a dropped connection or a timeout may hide a payment: reconcile asks."""
    if isinstance(exc, (PayPalRequestError, PayPalDeclinedError, AuthValidationException)):
        return True
    if isinstance(exc, ApiException) and exc.response_code in _NOTHING_PROCESSED:
        return not issues_of(exc) & ALREADY_DONE_ISSUES
    return False


def issues_of(exc: BaseException) -> frozenset[str]:
    """The ``details[].issue`` values of a PayPal error (empty when it has none)."""
    details = getattr(exc, "details", None) or []
    return frozenset(str(getattr(d, "issue", "")) for d in details if getattr(d, "issue", None))


class PayPalAdapter(AdapterCalls):
    """PayPal's charge, authorize, capture, refund and void as ``OutboundCall`` objects.

    ``base_url`` points the SDK elsewhere (a sandbox proxy, the fake); None keeps the
    SDK's own (``environment``: its ``Environment`` or "sandbox"/"production", None =
    the SDK's default, the sandbox). ``checklist_source``: the vault id ``send`` uses.
    It pays with vaulted sources only; every call masks ``CARD_DATA`` in what is stored,
    and ``mask=`` adds field paths, never one reconcile reads (``amount``, ``currency``,
    ``reference``, ``source``, ``payment_id``).
    """

    def __init__(
        self,
        client_id: str,
        client_secret: str,
        *,
        base_url: str | None = None,
        environment: Any = None,
        timeout: float | timedelta = DEFAULT_HTTP_TIMEOUT,
        attempt_timeout: float | timedelta = DEFAULT_ATTEMPT_TIMEOUT,
        name: str = "paypal",
        checklist_source: str = CHECKLIST_VAULT_ID,
        mask: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.timeout = _http_timeout(timeout, attempt_timeout)
        self.attempt_timeout = to_seconds(attempt_timeout, what="attempt_timeout")
        self.checklist_source = checklist_source
        self.client = PaypalServersdkClient(
            config=self._configuration(client_id, client_secret, base_url, environment)
        )
        verdict = definite_verdict(is_definite_failure)
        call = CallMaker(name, PAYMENTS_KEY_RETENTION, verdict, MAX_REQUEST_ID_LENGTH)
        # A capture's or refund's NotSent is the key's replay, nothing read: on its resend no
        # refusal is definite but a refused status in a 2xx, PayPal's answer under the key.
        resent = UnprovenResends("PayPal", verdict, (PayPalDeclinedError,))
        # An order's reconcile replays its create-order from the stored request: the
        # vaulted source (an id, not card data) is kept with what it compares.
        orders, payments = adapter_policies(
            CARD_DATA, mask, payment_kept=(*PAYMENT_KEPT, "source", "source_kind")
        )

        def order_call(kind: str, capture: bool) -> OutboundCall:
            pay = partial(self._pay, capture=capture)
            reconcile = partial(self._reconcile_order, capture=capture)
            return call(kind, pay, reconcile, orders, ORDER_KEY_RETENTION)

        self.charge = order_call("charge", capture=True)
        self.authorize = order_call("authorize", capture=False)
        self.capture = call(
            "capture", resent(self._send_capture), self._reconcile_by_replay, payments
        )
        self.refund = call("refund", resent(self._send_refund), self._reconcile_by_replay, payments)
        self.void = call("void", self._send_void, self._reconcile_void, payments)

    def _configuration(
        self, client_id: str, client_secret: str, base_url: str | None, environment: Any
    ) -> Any:
        """The SDK's own retries off (a retry is the core's decision, under our key):
        ``max_retries=0`` and no retry statuses (an empty ``retry_methods`` would mean
        "every verb" to urllib3, so the SDK's default stays, moot at 0 retries); its
        timeout below the attempt's. ``Configuration.get_base_uri`` reads the
        instance's ``environments`` map, so ``base_url`` replaces that map, for every
        environment, on this configuration only."""
        options: dict[str, Any] = {
            "timeout": self.timeout,
            "max_retries": 0,
            "retry_statuses": [],
            "client_credentials_auth_credentials": ClientCredentialsAuthCredentials(
                client_id, client_secret
            ),
        }
        if environment is not None:
            options["environment"] = Environment.from_value(environment)
            if options["environment"] is None:
                raise ValueError(f"unknown PayPal environment {environment!r}")
        config = Configuration(**options)
        if base_url is not None:
            root = base_url.rstrip("/")
            config.environments = {env: {Server.DEFAULT: root} for env in Environment}
        return config

    # --- the checklist's probes -------------------------------------------------------------

    def _checklist_request(self, amount: int, key: str) -> dict[str, Any]:
        return dict(amount=amount, currency="usd", reference=key, source=self.checklist_source)

    def lookup(self, idempotency_key: str) -> Any:
        """What the key's charge made: the order replayed under its key and read back; None
        when it has no capture. A key never sent leaves an unpaid order behind (no money)."""
        key = fit_key(idempotency_key, MAX_REQUEST_ID_LENGTH)
        order = self._find_order(payment_request(self._checklist_request(1, key)), key, True)
        return order_result(order, True)

    # --- orders: charge and authorize -------------------------------------------------------

    def _pay(self, call: CallContext, *, capture: bool) -> dict[str, Any]:
        """Create the order (no money moves), then capture or authorize it with the
        vaulted source under our key: the one request that moves money."""
        wanted = payment_request(call.request)
        order = self._create_order(wanted, call.idempotency_key, capture)
        what = f"PayPal's order {order.get('id')}"
        refuse_another_requests_answer(what, wanted_facts(wanted), order_facts(order))
        # An order the create answers already paid: our key's earlier capture (a replay),
        # or an order created with its source (by an adapter before this one) paid at once.
        result = order_result(order, capture)
        if result is not None:
            refuse_another_requests_answer(what, wanted_facts(wanted), result_facts(result))
            return result
        options = keyed(call.idempotency_key, id=order["id"])
        if not sabotage.active(PAYPAL_ORDER_CREATED_WITH_SOURCE):
            options["body"] = paying_body(wanted, capture)
        orders = self.client.orders
        paid = orders.capture_order(options) if capture else orders.authorize_order(options)
        result = order_result(body_of(paid), capture)
        if result is None:
            raise RuntimeError(f"PayPal answered order {order['id']} with no payment in it")
        refuse_another_requests_answer(what, wanted_facts(wanted), result_facts(result))
        return result

    def _create_order(self, wanted: WantedPayment, key: str, capture: bool) -> dict[str, Any]:
        """Create (or, under its key, find) the order: amount and ``custom_id`` only, never
        the payment source, so creating it, or replaying that in reconcile, moves no money."""
        intent = CheckoutPaymentIntent.CAPTURE if capture else CheckoutPaymentIntent.AUTHORIZE
        amount = AmountWithBreakdown(wanted.currency, decimal_value(wanted.amount, wanted.currency))
        unit = PurchaseUnitRequest(amount=amount, custom_id=wanted.reference)
        source: dict[str, Any] = {}
        if sabotage.active(PAYPAL_ORDER_CREATED_WITH_SOURCE):
            source["payment_source"] = PaymentSource(**vaulted(wanted))
        body = OrderRequest(intent=intent, purchase_units=[unit], **source)
        return body_of(self.client.orders.create_order(keyed(order_request_id(key), body=body)))

    def _find_order(self, wanted: WantedPayment, key: str, capture: bool) -> dict[str, Any]:
        """The order the key's first attempt made: the create-order replayed (PayPal
        answers the same order while it keeps the key), then read with GET. When the
        first attempt never reached PayPal this creates an unpaid order: the create
        carries no payment source, so the sweep's or a cancel's reconcile never pays."""
        order_id = self._create_order(wanted, key, capture)["id"]
        return body_of(self.client.orders.get_order({"id": order_id}))

    def _reconcile_order(self, call: CallContext, lookup: Lookup, *, capture: bool) -> Any:
        """Completed when the order holds its payment; NotSent while it is open (the
        resend replays both keys); Unknown once the order's key may be gone."""
        limit = ORDER_KEY_RETENTION.total_seconds()
        if lookup.key_age is None or lookup.key_age.total_seconds() + self.attempt_timeout >= limit:
            return Unknown(
                "PayPal has no lookup by PayPal-Request-Id and keeps an order's key 6 h: the "
                "key's age is unknown or too close to that, so replaying it could make a new "
                "order instead of finding the first; check the merchant's PayPal activity"
            )
        try:
            wanted = payment_request(lookup.request)
        except PayPalRequestError as exc:
            return Unknown(f"the stored request cannot replay the order ({exc}): masked?")
        order = self._find_order(wanted, lookup.idempotency_key, capture)
        what = f"PayPal's order {order.get('id')}"
        mine = adopt(what, wanted_facts(wanted), order_facts(order), None)
        if isinstance(mine, Unknown):
            return mine
        try:
            result = order_result(order, capture)
        except PayPalDeclinedError as exc:
            return Unknown(f"{exc}; decide whether to charge again")
        if result is not None:
            return adopt(what, wanted_facts(wanted), result_facts(result), result)
        if order.get("status") in _OPEN_ORDER:
            return NotSent()
        return Unknown(f"PayPal order {order.get('id')} is {order.get('status')}, unpaid")

    # --- payments: capture an authorization, refund a capture, void an authorization ----

    def _target(self, request: Any) -> tuple[str, int | None, str | None]:
        """``{"payment_id", "amount": int | None[, "currency"]}`` checked (an amount PayPal
        cannot take in the named currency too, before anything is sent)."""
        request = checks.mapping(request)
        payment_id = field_of(request, "payment_id", str)
        amount = field_of(request, "amount", int, required=False)
        if amount is not None and amount <= 0:
            raise PayPalRequestError("request field 'amount' must be > 0")
        currency = field_of(request, "currency", str, required=False)
        if amount is not None and currency is not None:
            decimal_value(amount, currency)
        return payment_id, amount, currency

    def _money(self, amount: int | None, currency: str | None, read: Any) -> Any:
        """PayPal's ``Money`` for a partial amount; the currency read back when not given
        (an amount PayPal cannot take in it is refused then, before the capture or refund)."""
        if amount is None:
            return None
        code = (currency or body_of(read())["amount"]["currency_code"]).upper()
        return Money(code, decimal_value(amount, code))

    def _send_capture(self, call: CallContext) -> dict[str, Any]:
        """``final_capture`` from the request, by default True for the whole authorization
        (no ``amount``) and False for a part: a final capture closes the authorization, so
        a partial one must leave the rest capturable for the next (design: PS18)."""
        return self._act(
            call, "authorization_id", CaptureRequest, final_capture=final_capture(call.request)
        )

    def _send_refund(self, call: CallContext) -> dict[str, Any]:
        return self._act(call, "capture_id", RefundRequest)

    def _act(self, call: CallContext, target: str, make: Any, **fields: Any) -> dict[str, Any]:
        """Capture an authorization, or refund a capture (``target``: which id it names).
        A 2xx whose status says no money moved (a capture DECLINED or FAILED, a refund
        FAILED or CANCELLED) is ``PayPalDeclinedError``, as an order's capture is; PENDING
        is the result, its ``status`` saying the money is not final yet."""
        payment_id, amount, currency = self._target(call.request)
        payments, capture = self.client.payments, target == "authorization_id"
        read = payments.get_authorized_payment if capture else payments.get_captured_payment
        money = self._money(amount, currency, partial(read, {target: payment_id}))
        body = make(**fields, **({"amount": money} if money else {}))
        send = payments.capture_authorized_payment if capture else payments.refund_captured_payment
        answer = body_of(send(keyed(call.idempotency_key, body=body, **{target: payment_id})))
        mine = own_answer(answer, payment_id, amount)
        kind = "capture" if capture else "refund"
        of = f"{kind} {mine.get('id')} of {target.partition('_')[0]} {payment_id}"
        again = (
            "; a retry under this key gets the same answer for 45 days: fix the cause, "
            f"then {kind} again under a new business key"
        )
        refused_or(mine, of, again)
        return payment_result(mine, **{target: payment_id})

    def _send_void(self, call: CallContext) -> dict[str, Any]:
        auth_id = field_of(checks.mapping(call.request), "payment_id", str)
        payments = self.client.payments
        body = body_of(payments.void_payment(keyed(call.idempotency_key, authorization_id=auth_id)))
        if not body:  # 204: PayPal answered minimally; read the authorization back
            body = body_of(payments.get_authorized_payment({"authorization_id": auth_id}))
        return payment_result(own_answer(body, auth_id, None, up=False))

    def _reconcile_by_replay(self, call: CallContext, lookup: Lookup) -> Any:
        """No read shows which capture or refund a key made, but PayPal keeps the key 45
        days: NotSent replays it (the core refuses that near the end of the window)."""
        if lookup.key_age is None or lookup.key_age >= PAYMENTS_KEY_RETENTION:
            return Unknown(
                "PayPal keeps a payment's PayPal-Request-Id 45 days and has no lookup by it; "
                "the key's age is unknown or past that, so a replay could act twice"
            )
        return NotSent()

    def _reconcile_void(self, call: CallContext, lookup: Lookup) -> Any:
        """The authorization's own status tells: VOIDED is done, CREATED is not yet."""
        auth_id = field_of(checks.mapping(lookup.request), "payment_id", str)
        read = self.client.payments.get_authorized_payment({"authorization_id": auth_id})
        body = body_of(read)
        if body.get("status") == "VOIDED":
            return Completed(payment_result(body))
        if body.get("status") == "CREATED":
            return NotSent()
        return Unknown(
            f"authorization {auth_id} is {body.get('status')}: it can no longer be "
            "voided (refund its capture instead)"
        )


__all__ = [
    "ALREADY_DONE_ISSUES",
    "CARD_DATA",
    "CHECKLIST_VAULT_ID",
    "MAX_REQUEST_ID_LENGTH",
    "ORDER_KEY_RETENTION",
    "PAYMENTS_KEY_RETENTION",
    "PayPalAdapter",
    "PayPalDeclinedError",
    "PayPalRequestError",
    "is_definite_failure",
    "issues_of",
    "order_request_id",
]
