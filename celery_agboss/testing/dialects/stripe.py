"""The Stripe dialect of ``FakeGatewayServer``: enough of Stripe's v1 API for its SDK.

Stripe is named only to identify its public API; celery_agboss is not affiliated with
or endorsed by Stripe. The official SDK (``StripeClient(base_addresses={"api": url})``)
creates and confirms, captures, cancels, retrieves, lists and searches PaymentIntents,
and creates and lists refunds, all on the server's one ``FakeGateway`` under the
``Idempotency-Key`` header: the fake's switches and faults show as Stripe's own answers
(its error shape and status codes, ``Idempotent-Replayed``). Search lags on purpose, as
Stripe warns it does: an object younger than ``search_lag`` seconds (gateway clock) is
not found yet; retrieve and list are consistent. The fake's ``ch_x`` is ``pi_x``.

A decline is what Stripe makes of it: the create-and-confirm leaves a PaymentIntent in
``requires_payment_method`` (with ``last_payment_error``; retrieved, listed, searched and
cancelled like any other) and answers 402 ``card_error`` naming it, and that 402 is saved
under the ``Idempotency-Key``: a repeat inside the key's retention gets it back
(``Idempotent-Replayed: true``) and no second attempt is made; a repeat with other
parameters (another card) is an ``idempotency_error``. A declining card (the server's
``declined_cards``, Stripe's ``STRIPE_DECLINING_METHODS``) and an injected ``DECLINE``
decline alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, ClassVar

from celery_agboss.core.durations import to_seconds
from celery_agboss.testing.dialects.canned import CannedReplies
from celery_agboss.testing.dialects.stripe_wire import (
    charge_answer,
    integer,
    invalid,
    listed,
    missing,
    newest_first,
    no_such,
    page_limit,
    parse_query,
    payment_id_of,
    render_intent,
    render_refund,
    stripe_error,
    stripe_failure,
    unfold_form,
    wire_amount,
)
from celery_agboss.testing.dialects.wire_units import STRIPE
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer, GatewayCall, Reply, Sends
from celery_agboss.testing.gateway_types import (
    FakeGatewayError,
    FakeGatewayTimeout,
    GatewayCapabilities,
    GatewayRequestOutcome,
    MoneyRequest,
)

STRIPE_DECLINING_METHODS = frozenset(
    {"pm_card_chargeDeclined", "pm_card_visa_chargeDeclined", "tok_chargeDeclined"}
)
"""Stripe's documented test payment methods that always decline."""

ACCEPTED_KEY_PREFIXES = ("sk_test_", "rk_test_")
"""Only test-mode keys are accepted: a live key pointed at the fake is a mistake (401)."""

Handler = Callable[[GatewayCall], Reply]


class StripeDialect:
    """Stripe's v1 PaymentIntents and Refunds on a ``FakeGatewayServer``.

    ``search_lag`` (seconds or a ``timedelta``, on the gateway's clock; a plain
    attribute, switchable mid-test): how old an object must be before search finds it;
    0 makes search consistent. ``answer_next`` makes the next request answer what a test
    chooses, so each documented error can be seen through the SDK (a money-moving one is
    in the gateway's ``requests`` all the same, ``CANNED``).
    """

    name = "stripe"
    documented_capabilities: ClassVar[GatewayCapabilities] = GatewayCapabilities(
        idempotency_keys=True,  # "all POST requests accept idempotency keys"
        lookup_by_key=True,  # the key is also in metadata: search (lagging) finds it
        key_retention=86400.0,  # "retains keys for at least 24 hours"
        first_response_on_repeat=True,  # "return the saved response, including 500 errors"
        conflict_on_mismatch=True,  # idempotency_error on other parameters
        reference_lookup=True,
        replays_failures=True,
    )

    def __init__(self, *, search_lag: float | timedelta = 0.0) -> None:
        self.search_lag = to_seconds(search_lag, what="search_lag")
        if self.search_lag < 0:
            raise ValueError("search_lag must be >= 0 seconds")
        self._canned = CannedReplies()

    def answer_next(self, reply: Reply, *, times: int = 1) -> None:
        """Answer the next ``times`` requests with ``reply``, nothing reaching the gateway
        (build Stripe-shaped errors with :func:`stripe_error`)."""
        self._canned.arm(reply, None, times)

    def clear_answers(self) -> None:
        """Disarm every ``answer_next`` not used yet."""
        self._canned.clear()

    def install(self, server: FakeGatewayServer) -> None:
        api = _StripeApi(server, self)
        routes: list[tuple[str, str, Handler]] = [
            ("POST", "/v1/payment_intents", api.create_intent),
            ("GET", "/v1/payment_intents", api.list_intents),
            ("GET", "/v1/payment_intents/search", api.search_intents),
            ("GET", "/v1/payment_intents/{id}", api.retrieve_intent),
            ("POST", "/v1/payment_intents/{id}/capture", api.capture_intent),
            ("POST", "/v1/payment_intents/{id}/cancel", api.cancel_intent),
            ("POST", "/v1/refunds", api.create_refund),
            ("GET", "/v1/refunds", api.list_refunds),
        ]
        sends = {
            "/v1/payment_intents": "charge",
            "/v1/payment_intents/{id}/capture": "capture",
            "/v1/payment_intents/{id}/cancel": "void",
            "/v1/refunds": "refund",
        }
        for method, path, handler in routes:
            operation = sends.get(path) if method == "POST" else None
            sent = None if operation is None else api.sent(operation)
            server.route(method, path, self._guarded(handler), sends=sent)

    def _guarded(self, handler: Handler) -> Handler:
        def endpoint(call: GatewayCall) -> Reply:
            return self._canned.take(call.path) or _authentication(call) or handler(call)

        return endpoint


def _authentication(call: GatewayCall) -> Reply | None:
    """Stripe's 401 for a missing or (here) a non-test API key."""
    header = call.header("Authorization") or ""
    scheme, _, api_key = header.partition(" ")
    if scheme.lower() == "bearer" and api_key.startswith(ACCEPTED_KEY_PREFIXES):
        return None
    if not api_key:
        return stripe_error(401, "invalid_request_error", "You did not provide an API key.")
    shown = f"{api_key[:8]}****{api_key[-4:]}" if len(api_key) > 12 else "****"
    return stripe_error(401, "invalid_request_error", f"Invalid API Key provided: {shown}")


def _wire_or_none(body: Mapping[str, Any], param: str, currency: str) -> int | None:
    """A form amount in ISO 4217 minor units; None when absent or unreadable."""
    try:
        value = integer(body, param)
    except ValueError:
        return None
    return None if value is None or not currency else STRIPE.from_wire(value, currency)


class _StripeApi:
    """The endpoints of one server: each maps a Stripe request onto its ``FakeGateway``."""

    def __init__(self, server: FakeGatewayServer, dialect: StripeDialect) -> None:
        self.server = server
        self.dialect = dialect

    @property
    def gateway(self) -> FakeGateway:
        """Read at each request: a test may give the server a fresh gateway."""
        return self.server.gateway

    def sent(self, operation: str) -> Sends:
        """What a request of ``operation`` is, for the one the server records itself (a
        canned reply, a refusal): its key, payment and amount where they can be read."""

        def read(call: GatewayCall) -> MoneyRequest:
            body, key = unfold_form(call.body), call.header("Idempotency-Key")
            if operation == "charge":
                currency = str(body.get("currency") or "")
                return MoneyRequest(operation, key, _wire_or_none(body, "amount", currency))
            target = call.params.get("id") or body.get("payment_intent") or body.get("charge")
            payment_id = payment_id_of(str(target or ""))
            if operation == "void" or payment_id is None:
                return MoneyRequest(operation, key, None, payment_id)
            try:
                currency = str(self.gateway.retrieve(payment_id)["currency"])
            except FakeGatewayError:
                currency = ""
            param = "amount_to_capture" if operation == "capture" else "amount"
            return MoneyRequest(operation, key, _wire_or_none(body, param, currency), payment_id)

        return read

    # --- PaymentIntents ----------------------------------------------------------------

    def create_intent(self, call: GatewayCall) -> Reply:
        body = unfold_form(call.body)
        key = call.header("Idempotency-Key")
        metadata = body.get("metadata")
        metadata = dict(metadata) if isinstance(metadata, dict) else {}
        reference = metadata.get("reference")
        self.server.charge_arrived(call, key, reference)
        try:
            amount = integer(body, "amount")
        except ValueError:
            return invalid("Invalid integer: amount", "amount")
        method = str(body.get("payment_method") or "")
        capture_method = str(body.get("capture_method") or "automatic")
        if amount is None:
            return missing("amount")
        if not body.get("currency") or not method:
            return missing("payment_method" if body.get("currency") else "currency")
        taken = wire_amount(amount, str(body["currency"]), "amount")  # ISK ×100, MGA ÷100
        if isinstance(taken, Reply):
            return taken
        amount = taken
        if str(body.get("confirm")).lower() != "true":
            message = "This fake confirms PaymentIntents at creation only: pass confirm=true."
            return invalid(message, "confirm", "parameter_invalid_empty")
        if capture_method not in ("automatic", "automatic_async", "manual"):
            message = f"Invalid capture_method: {capture_method}"
            return invalid(message, "capture_method", "parameter_unknown")
        declining = method in self.server.declined_cards or method in STRIPE_DECLINING_METHODS
        known = {"amount", "currency", "metadata", "payment_method", "capture_method"}
        params = {name: value for name, value in body.items() if name not in known}

        def charge() -> dict[str, Any]:
            currency = str(body["currency"]).lower()
            return self.gateway.charge(
                amount, key, currency=currency, reference=reference,
                capture=capture_method != "manual", metadata=metadata,
                payment_method=method, capture_method=capture_method, params=params,
                card_declines=declining, saves_declines=True,
            )  # fmt: skip

        seen_before = len(self.gateway.requests_for(key)) if key is not None else 0
        reply = self._keyed(call, key, "charge", charge, charge_answer, "")
        declined = GatewayRequestOutcome.DECLINED
        if reply.status == 402 and self.gateway.made_now(key, seen_before, declined):
            # the server's declined card is recorded in its ``declines`` (not a replay)
            self.server.is_declined_card(call, method, key, reference)
        if reply.status != 200:
            return reply
        return self.server.deliver_answer(call, key, reference, reply)

    def capture_intent(self, call: GatewayCall) -> Reply:
        try:
            amount = integer(unfold_form(call.body), "amount_to_capture")
        except ValueError:
            return invalid("Invalid integer: amount_to_capture", "amount_to_capture")
        if amount is not None:
            taken = self._in_currency_of(call.params["id"], amount, "amount_to_capture")
            if isinstance(taken, Reply):
                return taken
            amount = taken
        return self._on_intent(
            call, "capture", lambda fake_id, key: self.gateway.capture(fake_id, key, amount=amount)
        )

    def _in_currency_of(self, stripe_id: str, value: int, param: str) -> int | Reply:
        """A capture's or refund's wire amount in the fake's ISO 4217 minor units, read in
        the currency of the PaymentIntent it names (Stripe's 404 when there is none)."""
        try:
            payment = self.gateway.retrieve(payment_id_of(stripe_id) or "")
        except FakeGatewayError:
            return no_such(stripe_id)
        return wire_amount(value, str(payment["currency"]), param)

    def cancel_intent(self, call: GatewayCall) -> Reply:
        """Stripe cancels a PaymentIntent awaiting capture, and one a decline left in
        ``requires_payment_method`` too (nothing moved: it stays out of ``payments``)."""

        def cancel(fake_id: str, key: str | None) -> Any:
            return self.gateway.void(fake_id, key, cancels_declined=True)

        return self._on_intent(call, "void", cancel)

    def _on_intent(
        self, call: GatewayCall, operation: str, perform: Callable[[str, str | None], Any]
    ) -> Reply:
        stripe_id, key = call.params["id"], call.header("Idempotency-Key")
        fake_id = payment_id_of(stripe_id)
        if fake_id is None:
            return no_such(stripe_id)
        return self._keyed(
            call, key, operation, lambda: perform(fake_id, key), render_intent, stripe_id
        )

    def retrieve_intent(self, call: GatewayCall) -> Reply:
        fake_id = payment_id_of(call.params["id"]) or ""
        try:
            return Reply(200, render_intent(self.gateway.retrieve(fake_id)))
        except FakeGatewayError:
            return no_such(call.params["id"])

    def _intents(self) -> list[dict[str, Any]]:
        """Every payment as the fake keeps it, declined ones too (each is a PaymentIntent)."""
        both = self.gateway.payments + self.gateway.declined_payments
        return sorted(both, key=lambda p: p["created"])

    def list_intents(self, call: GatewayCall) -> Reply:
        intents = [render_intent(p) for p in self._intents()]
        return listed(call, intents, "/v1/payment_intents")

    def search_intents(self, call: GatewayCall) -> Reply:
        if not self.gateway.lookup_by_key:
            message = "Search is not available on this account."
            return stripe_error(400, "invalid_request_error", message)
        query = call.query.get("query", "")
        wanted = parse_query(query)
        if wanted is None:
            message = f"This fake searches metadata['field']:'value' AND ... only, not {query!r}"
            return invalid(message, "query", "parameter_invalid_string")
        visible_before = self.gateway.now() - self.dialect.search_lag
        found = [
            render_intent(p)
            for p in self._intents()
            if p["created"] <= visible_before
            and all((p.get("metadata") or {}).get("metadata", {}).get(f) == v for f, v in wanted)
        ]
        limit, start = page_limit(call), int(call.query.get("page") or 0)
        found = newest_first(found)[start:]
        more = len(found) > limit
        page = {"object": "search_result", "data": found[:limit], "has_more": more}
        page["next_page"] = str(start + limit) if more else None
        return Reply(200, {**page, "url": "/v1/payment_intents/search"})

    # --- Refunds -----------------------------------------------------------------------

    def create_refund(self, call: GatewayCall) -> Reply:
        body = unfold_form(call.body)
        target = str(body.get("payment_intent") or body.get("charge") or "")
        if not target:
            return missing("payment_intent")
        fake_id = payment_id_of(target)
        if fake_id is None:
            return no_such(target)
        try:
            amount = integer(body, "amount")
        except ValueError:
            return invalid("Invalid integer: amount", "amount")
        if amount is not None:
            taken = self._in_currency_of(target, amount, "amount")
            if isinstance(taken, Reply):
                return taken
            amount = taken
        metadata = body.get("metadata")
        # The fake keeps a refund's reference only: Stripe's metadata and reason ride in
        # it, so they are part of the key's parameters and come back with the refund.
        kept = {"metadata": metadata if isinstance(metadata, dict) else {}}
        extras = json.dumps({**kept, "reason": body.get("reason")}, sort_keys=True)
        key = call.header("Idempotency-Key")
        refund = lambda: self.gateway.refund(fake_id, key, amount=amount, reference=extras)  # noqa: E731
        return self._keyed(call, key, "refund", refund, render_refund, target)

    def list_refunds(self, call: GatewayCall) -> Reply:
        target = call.query.get("payment_intent") or call.query.get("charge")
        fake_id = payment_id_of(target) if target else None
        refunds = self.gateway.refunds
        mine = [render_refund(r) for r in refunds if target is None or r["payment"] == fake_id]
        return listed(call, mine, "/v1/refunds")

    # --- the one keyed path ------------------------------------------------------------

    def _keyed(
        self,
        call: GatewayCall,
        key: str | None,
        operation: str,
        perform: Callable[[], dict[str, Any]],
        render: Callable[[Mapping[str, Any]], dict[str, Any] | Reply],
        target: str,
    ) -> Reply:
        """Run one money-moving request and answer it as Stripe does, headers included."""
        seen_before = len(self.gateway.requests_for(key)) if key is not None else 0
        try:
            receipt = perform()
        except FakeGatewayTimeout:
            return Reply(0, drop=True)  # processed or not, the caller gets no answer
        except FakeGatewayError as exc:
            error = stripe_failure(exc, operation, target)
            headers = {**error.headers, **self._answer_headers(key, seen_before)}
            return Reply(error.status, error.payload, headers=headers)
        headers = self._answer_headers(key, seen_before)
        rendered = render(receipt)
        if isinstance(rendered, Reply):  # an error the key saved (a decline's 402)
            return Reply(rendered.status, rendered.payload, headers={**rendered.headers, **headers})
        return Reply(200, rendered, headers=headers)

    def _answer_headers(self, key: str | None, seen_before: int) -> dict[str, str]:
        """``Request-Id``, the key echoed, and ``Idempotent-Replayed: true`` on a replay.

        This request is the one after the ``seen_before`` already recorded under its key
        (exact unless two requests under one key arrive at the same instant).
        """
        if key is None:
            return {}
        mine = self.gateway.requests_for(key)[seen_before:]
        headers = {"Idempotency-Key": key}
        if mine:
            headers["Request-Id"] = mine[0].request_id
            if mine[0].outcome is GatewayRequestOutcome.REPLAYED:
                headers["Idempotent-Replayed"] = "true"
        return headers


__all__ = [
    "ACCEPTED_KEY_PREFIXES",
    "STRIPE_DECLINING_METHODS",
    "StripeDialect",
    "render_intent",
    "render_refund",
    "stripe_error",
    "unfold_form",
]
