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
``requires_payment_method`` (with ``last_payment_error``; retrieved, listed and searched
like any other) and answers 402 ``card_error`` naming it, and that 402 is saved under the
``Idempotency-Key``: a repeat inside the key's retention gets it back
(``Idempotent-Replayed: true``) and no second attempt is made; a repeat with other
parameters (another card) is an ``idempotency_error``. A declining card (the server's
``declined_cards``, Stripe's ``STRIPE_DECLINING_METHODS``) and an injected ``DECLINE``
decline alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, ClassVar

from celery_agboss.core.durations import to_seconds
from celery_agboss.testing.dialects.canned import CannedReplies
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer, GatewayCall, Reply
from celery_agboss.testing.gateway_types import (
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayTimeout,
    GatewayCapabilities,
    GatewayRequestOutcome,
)

STRIPE_DECLINING_METHODS = frozenset(
    {"pm_card_chargeDeclined", "pm_card_visa_chargeDeclined", "tok_chargeDeclined"}
)
"""Stripe's documented test payment methods that always decline."""

ACCEPTED_KEY_PREFIXES = ("sk_test_", "rk_test_")
"""Only test-mode keys are accepted: a live key pointed at the fake is a mistake (401)."""

_INTENT, _CHARGE = "pi_", "ch_"
_CLAUSE = re.compile(
    r"""\s*metadata\[(['"])(?P<field>.+?)\1\]"""  # metadata['field']
    r""":(['"])(?P<value>(?:\\.|(?!\3).)*)\3\s*"""  # :'value', \' escaping a quote
)
_INDEX = re.compile(r"\[([^\[\]]*)\]")
_DECLINED = "declined"  # the fake gateway's status of a declined payment
_DECLINE_MESSAGE = "Your card was declined."
_INVALID_CODE = {"refund": "charge_already_refunded", "charge": "parameter_invalid_integer"}
_REUSED = "Keys for idempotent requests can only be used with the same parameters."
_IN_FLIGHT = "There is currently another in-progress request using this idempotency key."


def stripe_error(
    status: int,
    kind: str,
    message: str,
    *,
    code: str | None = None,
    decline_code: str | None = None,
    param: str | None = None,
) -> Reply:
    """A reply in Stripe's error shape, ``{"error": {"type", "code", "message", ...}}``."""
    error: dict[str, Any] = {"type": kind, "message": message}
    for name, value in (("code", code), ("decline_code", decline_code), ("param", param)):
        if value is not None:
            error[name] = value
    return Reply(status, {"error": error})


def unfold_form(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata[k]=v`` and ``expand[0]=x``, as the SDK encodes them, back into objects."""
    root: dict[str, Any] = {}
    for name, value in flat.items():
        head, bracket, rest = name.partition("[")
        path = [head, *_INDEX.findall(bracket + rest)] if bracket else [head]
        node = root
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = value
    unfolded: dict[str, Any] = _lists(root)
    return unfolded


def _lists(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    items = {k: _lists(v) for k, v in node.items()}
    if items and all(k.isdigit() for k in items):
        return [items[k] for k in sorted(items, key=int)]
    return items


def _intent_id(fake_id: str) -> str:
    return _INTENT + fake_id.removeprefix(_CHARGE)


def _fake_id(stripe_id: str) -> str | None:
    """The fake's payment id behind a PaymentIntent (or charge) id; None for other ids."""
    if stripe_id.startswith(_INTENT):
        return _CHARGE + stripe_id[len(_INTENT) :]
    return stripe_id if stripe_id.startswith(_CHARGE) else None


def render_intent(receipt: Mapping[str, Any]) -> dict[str, Any]:
    """The fake's payment as a PaymentIntent (a refunded one stays ``succeeded``, as Stripe's;
    a declined one is ``requires_payment_method``, its payment method detached and named in
    ``last_payment_error``)."""
    extras = receipt.get("metadata") or {}
    status = "succeeded" if receipt["status"] == "refunded" else receipt["status"]
    if status == _DECLINED:
        return {
            **render_intent({**receipt, "status": "requires_payment_method"}),
            "payment_method": None,
            "last_payment_error": _decline_error(extras.get("payment_method"), receipt["id"]),
        }
    return {
        "id": _intent_id(receipt["id"]),
        "object": "payment_intent",
        "amount": receipt["amount"],
        "amount_capturable": receipt["amount"] if status == "requires_capture" else 0,
        "amount_received": receipt["amount_captured"],
        "capture_method": extras.get("capture_method", "automatic"),
        "created": int(receipt["created"]),
        "currency": receipt["currency"],
        "latest_charge": receipt["id"],
        "metadata": dict(extras.get("metadata") or {}),
        "payment_method": extras.get("payment_method"),
        "status": status,
        "last_payment_error": None,
    }


def render_refund(refund: Mapping[str, Any]) -> dict[str, Any]:
    extras = json.loads(refund["reference"]) if refund.get("reference") else {}
    return {
        "id": refund["id"],
        "object": "refund",
        "amount": refund["amount"],
        "charge": refund["payment"],
        "created": int(refund["created"]),
        "currency": refund["currency"],
        "metadata": dict(extras.get("metadata") or {}),
        "payment_intent": _intent_id(refund["payment"]),
        "reason": extras.get("reason"),
        "status": refund["status"],
    }


def _integer(body: Mapping[str, Any], name: str) -> int | None:
    """A form integer; ``ValueError`` names the field when it is not one."""
    raw = body.get(name)
    if raw is None or raw == "":
        return None
    if isinstance(raw, str) and raw.lstrip("-").isdigit():
        return int(raw)
    raise ValueError(name)


def _invalid(message: str, param: str, code: str = "parameter_invalid_integer") -> Reply:
    return stripe_error(400, "invalid_request_error", message, code=code, param=param)


def _missing(param: str) -> Reply:
    return _invalid(f"Missing required param: {param}.", param, "parameter_missing")


def _no_such(stripe_id: str) -> Reply:
    message = f"No such payment_intent: '{stripe_id}'"
    return stripe_error(404, "invalid_request_error", message, code="resource_missing")


def _decline_error(payment_method: Any, charge: Any = None) -> dict[str, Any]:
    """Stripe's ``card_error`` of a generic decline (an intent's ``last_payment_error``)."""
    error: dict[str, Any] = {
        "type": "card_error",
        "code": "card_declined",
        "decline_code": "generic_decline",
        "message": _DECLINE_MESSAGE,
    }
    if charge is not None:
        error["charge"] = charge
    if payment_method:
        error["payment_method"] = {"id": payment_method, "object": "payment_method"}
    return error


def _declined() -> Reply:
    return Reply(402, {"error": _decline_error(None)})


def _charge_answer(receipt: Mapping[str, Any]) -> dict[str, Any] | Reply:
    """A create-and-confirm's answer: the PaymentIntent, or for a declined one Stripe's 402
    ``card_error`` carrying it (``error.payment_intent``), as the key saves and replays it."""
    intent = render_intent(receipt)
    if receipt["status"] != _DECLINED:
        return intent
    error = {**intent["last_payment_error"], "payment_intent": intent}
    return Reply(402, {"error": error})


Handler = Callable[[GatewayCall], Reply]


class StripeDialect:
    """Stripe's v1 PaymentIntents and Refunds on a ``FakeGatewayServer``.

    ``search_lag`` (seconds or a ``timedelta``, on the gateway's clock; a plain
    attribute, switchable mid-test): how old an object must be before search finds it;
    0 makes search consistent. ``answer_next`` makes the next request answer what a test
    chooses, so each documented error can be seen through the SDK.
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
        for method, path, handler in routes:
            server.route(method, path, self._guarded(handler))

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


class _StripeApi:
    """The endpoints of one server: each maps a Stripe request onto its ``FakeGateway``."""

    def __init__(self, server: FakeGatewayServer, dialect: StripeDialect) -> None:
        self.server = server
        self.dialect = dialect

    @property
    def gateway(self) -> FakeGateway:
        """Read at each request: a test may give the server a fresh gateway."""
        return self.server.gateway

    # --- PaymentIntents ----------------------------------------------------------------

    def create_intent(self, call: GatewayCall) -> Reply:
        body = unfold_form(call.body)
        key = call.header("Idempotency-Key")
        metadata = body.get("metadata")
        metadata = dict(metadata) if isinstance(metadata, dict) else {}
        reference = metadata.get("reference")
        self.server.charge_arrived(call, key, reference)
        try:
            amount = _integer(body, "amount")
        except ValueError:
            return _invalid("Invalid integer: amount", "amount")
        method = str(body.get("payment_method") or "")
        capture_method = str(body.get("capture_method") or "automatic")
        if amount is None:
            return _missing("amount")
        if not body.get("currency") or not method:
            return _missing("payment_method" if body.get("currency") else "currency")
        if str(body.get("confirm")).lower() != "true":
            message = "This fake confirms PaymentIntents at creation only: pass confirm=true."
            return _invalid(message, "confirm", "parameter_invalid_empty")
        if capture_method not in ("automatic", "automatic_async", "manual"):
            message = f"Invalid capture_method: {capture_method}"
            return _invalid(message, "capture_method", "parameter_unknown")
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
        reply = self._keyed(call, key, "charge", charge, _charge_answer, "")
        if reply.status == 402 and self._declined_now(key, seen_before):
            # the server's declined card is recorded in its ``declines`` (not a replay)
            self.server.is_declined_card(call, method, key, reference)
        if reply.status != 200:
            return reply
        return self.server.deliver_answer(call, key, reference, reply)

    def capture_intent(self, call: GatewayCall) -> Reply:
        try:
            amount = _integer(unfold_form(call.body), "amount_to_capture")
        except ValueError:
            return _invalid("Invalid integer: amount_to_capture", "amount_to_capture")
        return self._on_intent(
            call, "capture", lambda fake_id, key: self.gateway.capture(fake_id, key, amount=amount)
        )

    def cancel_intent(self, call: GatewayCall) -> Reply:
        return self._on_intent(call, "void", self.gateway.void)

    def _on_intent(
        self, call: GatewayCall, operation: str, perform: Callable[[str, str | None], Any]
    ) -> Reply:
        stripe_id, key = call.params["id"], call.header("Idempotency-Key")
        fake_id = _fake_id(stripe_id)
        if fake_id is None:
            return _no_such(stripe_id)
        return self._keyed(
            call, key, operation, lambda: perform(fake_id, key), render_intent, stripe_id
        )

    def retrieve_intent(self, call: GatewayCall) -> Reply:
        fake_id = _fake_id(call.params["id"]) or ""
        try:
            return Reply(200, render_intent(self.gateway.retrieve(fake_id)))
        except FakeGatewayError:
            return _no_such(call.params["id"])

    def _intents(self) -> list[dict[str, Any]]:
        """Every payment as the fake keeps it, declined ones too (each is a PaymentIntent)."""
        both = self.gateway.payments + self.gateway.declined_payments
        return sorted(both, key=lambda p: p["created"])

    def _declined_now(self, key: str | None, seen_before: int) -> bool:
        """Whether this request was declined now, not answered from its key."""
        if key is None:
            return True
        mine = self.gateway.requests_for(key)[seen_before:]
        return bool(mine) and mine[0].outcome is GatewayRequestOutcome.DECLINED

    def list_intents(self, call: GatewayCall) -> Reply:
        intents = [render_intent(p) for p in self._intents()]
        return _listed(call, intents, "/v1/payment_intents")

    def search_intents(self, call: GatewayCall) -> Reply:
        if not self.gateway.lookup_by_key:
            message = "Search is not available on this account."
            return stripe_error(400, "invalid_request_error", message)
        query = call.query.get("query", "")
        wanted = _parse_query(query)
        if wanted is None:
            message = f"This fake searches metadata['field']:'value' AND ... only, not {query!r}"
            return _invalid(message, "query", "parameter_invalid_string")
        visible_before = self.gateway.now() - self.dialect.search_lag
        found = [
            render_intent(p)
            for p in self._intents()
            if p["created"] <= visible_before
            and all((p.get("metadata") or {}).get("metadata", {}).get(f) == v for f, v in wanted)
        ]
        limit, start = _limit(call), int(call.query.get("page") or 0)
        found = _newest_first(found)[start:]
        more = len(found) > limit
        page = {"object": "search_result", "data": found[:limit], "has_more": more}
        page["next_page"] = str(start + limit) if more else None
        return Reply(200, {**page, "url": "/v1/payment_intents/search"})

    # --- Refunds -----------------------------------------------------------------------

    def create_refund(self, call: GatewayCall) -> Reply:
        body = unfold_form(call.body)
        target = str(body.get("payment_intent") or body.get("charge") or "")
        if not target:
            return _missing("payment_intent")
        fake_id = _fake_id(target)
        if fake_id is None:
            return _no_such(target)
        try:
            amount = _integer(body, "amount")
        except ValueError:
            return _invalid("Invalid integer: amount", "amount")
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
        fake_id = _fake_id(target) if target else None
        refunds = self.gateway.refunds
        mine = [render_refund(r) for r in refunds if target is None or r["payment"] == fake_id]
        return _listed(call, mine, "/v1/refunds")

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
            error = _stripe_failure(exc, operation, target)
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


def _stripe_failure(exc: FakeGatewayError, operation: str, target: str) -> Reply:
    """A fake gateway failure as the error Stripe answers for it (else a 500 api_error)."""
    if exc.kind is FakeGatewayErrorKind.CONFLICT:
        return stripe_error(400, "idempotency_error", _REUSED)
    if exc.kind is FakeGatewayErrorKind.IN_PROGRESS:
        return stripe_error(409, "invalid_request_error", _IN_FLIGHT, code="idempotency_key_in_use")
    if exc.kind is FakeGatewayErrorKind.DECLINED:
        return _declined()
    if exc.kind is FakeGatewayErrorKind.NOT_FOUND:
        return _no_such(target)
    if exc.kind is FakeGatewayErrorKind.INVALID_REQUEST:
        code = _INVALID_CODE.get(operation, "payment_intent_unexpected_state")
        return stripe_error(400, "invalid_request_error", str(exc), code=code)
    return stripe_error(500, "api_error", "An unknown error occurred while processing.")


def _parse_query(query: str) -> list[tuple[str, str]] | None:
    """``metadata['f']:'v' AND ...`` → ``[(f, v), ...]``; None for anything else."""
    clauses = []
    for text in query.split(" AND "):
        matched = _CLAUSE.fullmatch(text)
        if matched is None:
            return None
        value = re.sub(r"\\(.)", r"\1", matched.group("value"))
        clauses.append((matched.group("field"), value))
    return clauses


def _limit(call: GatewayCall) -> int:
    raw = call.query.get("limit") or "10"
    return max(1, min(100, int(raw))) if raw.isdigit() else 10


def _newest_first(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stripe's order; the fake lists oldest first, so a stable sort keeps ties right."""
    return sorted(objects[::-1], key=lambda o: o["created"], reverse=True)


def _listed(call: GatewayCall, objects: list[dict[str, Any]], url: str) -> Reply:
    """A Stripe list, newest first, paged by ``limit`` and ``starting_after``."""
    objects = _newest_first(objects)
    after = call.query.get("starting_after")
    if after:
        ids = [o["id"] for o in objects]
        objects = objects[ids.index(after) + 1 :] if after in ids else []
    limit = _limit(call)
    more = len(objects) > limit
    return Reply(200, {"object": "list", "data": objects[:limit], "has_more": more, "url": url})


__all__ = [
    "ACCEPTED_KEY_PREFIXES",
    "STRIPE_DECLINING_METHODS",
    "StripeDialect",
    "render_intent",
    "render_refund",
    "stripe_error",
    "unfold_form",
]
