"""Checkout.com's charge, authorize, capture, refund and void as ``OutboundCall`` objects,
through its official SDK (``checkout-sdk``). Checkout.com is named only to identify its
public API; this adapter is not affiliated with or endorsed by it.

``Cko-Idempotency-Key`` goes on every POST; Checkout.com keeps it 24 h by default (an
account may be set otherwise: ``key_retention`` is your account's, never more) and
replays a 2xx answer only, so a resend after a 4xx or 5xx runs again. Reconcile lists a
charge's reference (``GET /payments?reference=``, not unique: reference, amount,
currency and the key the adapter writes into metadata must match, or the payment is
not taken for the call's, ``Unknown``) and an action's
payment (``GET /payments/{id}/actions``, by the key in its metadata). A capture or refund
without an amount took what was left when it was made: the authorisation less the parts
captured before it (``capture_type: "NonFinal"``), or what was captured by then less the
refunds before it, ordered by ``processed_on`` read as times (its precision varies). A miss is
``NotSent()`` only inside the key's retention, where a resend is safe either way:
nothing was processed, or its 2xx is replayed from the key. That relies on these reads
being current (Checkout.com documents no lag): a request answered 4xx or 5xx saves
nothing under the key, so a payment it made that a lagging read missed would be made
again by the resend. An action listed ``approved: false`` (declined after its 202) moved
no money: send raises ``CheckoutDeclinedError``, and reconcile never takes it for done
(``Unknown``). A payment answered 202 ``Pending`` (3-D Secure, an asynchronous method) is
not decided: send returns it read by its id, and reconcile as listed, with status
``Pending`` (not paid; the app follows it up).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from celery_agboss.adapters.common import require_sdk

require_sdk("checkout_sdk", pip_extra="checkout", gateway="Checkout.com")

from checkout_sdk.exception import (
    CheckoutApiException,
    CheckoutArgumentException,
    CheckoutAuthorizationException,
    CheckoutException,
)

from celery_agboss.adapters.checkout_client import (
    PENDING,
    BoundedHTTPAdapter,
    approved_first,
    as_dict,
    bounded_session,
    build_sdk,
    declined,
    declined_reason,
    one_send,
    plain,
    status_code,
)
from celery_agboss.adapters.checkout_requests import (
    CHECKOUT_UNITS,
    KEY_METADATA_FIELD,
    CheckoutAdapterError,
    CheckoutDeclinedError,
    CheckoutNoAnswerError,
    CheckoutRefusedError,
    CheckoutRequestError,
    iso_amount,
    key_mark,
    left_when_made,
    marked_key,
    metadata_with_key,
    payment_result,
    request_checks,
    source_of,
)
from celery_agboss.adapters.common import (
    DEFAULT_ATTEMPT_TIMEOUT,
    DEFAULT_HTTP_TIMEOUT,
    AdapterCalls,
    CallMaker,
    PaymentFacts,
    adapter_policies,
    adopt_action,
    adopt_one_of,
    definite_verdict,
    http_timeout_seconds,
    linked_id,
    refuse_another_requests_answer,
    request_facts,
)
from celery_agboss.adapters.minor_units import to_gateway
from celery_agboss.core.durations import to_seconds
from celery_agboss.core.outbound import CallContext, Lookup, NotSent, ReconcileAnswer, Unknown

DEFAULT_KEY_RETENTION = timedelta(hours=24)
_DEFINITE_STATUSES = frozenset({400, 401, 403, 404, 422})
_ACTION_TYPES = {"capture": "Capture", "refund": "Refund", "void": "Void"}
_DECLINE_FIELDS = ("approved", "response_code", "response_summary")
_PAGE, _MAX_PAGES = 100, 10
CARD_DATA = ("source",)
"""What the policy of every call masks by default: the payment source, where a card's
number, expiry, CVV and holder name go (``{"type": "card", "number": …}``), as do the
token or stored source that stands for one."""
TEST_CARD = {"type": "card", "number": "4242424242424242", "expiry_month": 12, "cvv": "100"}
"""The test card ``send`` (the checklist's charge) pays with (sandbox only), expiring
in December three years on."""


def is_nothing_processed(exc: BaseException) -> bool:
    """Definite only when nothing was processed: a decline, a refusal (400, 401, 403, 404,
    422), a malformed request, an SDK argument or credential error raised before sending.
    A 409, a 429 (Checkout.com's answer to a key still in flight), a 5xx, a dropped
    connection or a timeout may have moved money."""
    if isinstance(exc, (CheckoutDeclinedError, CheckoutRefusedError, CheckoutRequestError)):
        return True
    if isinstance(exc, CheckoutApiException):
        return status_code(exc) in _DEFINITE_STATUSES
    return isinstance(exc, (CheckoutArgumentException, CheckoutAuthorizationException))


# --- requests and results ------------------------------------------------------------------


def _facts(payment: Mapping[str, Any]) -> PaymentFacts:
    """A payment (a 201, or listed by reference) as what tells it from another (its amount
    in ISO 4217 minor units, as the request's); the key is the mark in its metadata."""
    currency = payment.get("currency")
    amount = iso_amount(payment.get("amount"), currency)
    return PaymentFacts(amount, currency, payment.get("reference"), marked_key(payment))


def _action_facts(result: Mapping[str, Any]) -> PaymentFacts:
    """An action's result as what tells it from another: its payment, type and amount."""
    return PaymentFacts(result.get("amount"), payment=result.get("id"), kind=result.get("type"))


def _own_action(kind: str, payment_id: str, amount: Any, result: dict[str, Any]) -> dict[str, Any]:
    """``result`` when it is this request's action and it was approved; a 202 replayed
    from another request made under the key (another payment, action or amount) is
    refused (design: only the request's payment), and a declined one moved no money."""
    wanted = PaymentFacts(amount, payment=payment_id, kind=_ACTION_TYPES[kind])
    what = f"Checkout.com's {kind} {result.get('action_id')}"
    refuse_another_requests_answer(what, wanted, _action_facts(result))
    if result.get("approved") is False:
        details = {k: result.get(k) for k in ("action_id", "type", *_DECLINE_FIELDS)}
        raise CheckoutDeclinedError(
            f"Checkout.com declined the {kind} {result.get('action_id')} of {payment_id}: "
            f"{result.get('response_code')} {result.get('response_summary')}",
            {"payment_id": payment_id, **details},
        )
    return result


class CheckoutAdapter(AdapterCalls):
    """Checkout.com's payments as outbound calls; see the module docstring.

    ``key_retention`` must be your account's idempotency window (24 h unless Checkout.com
    set yours otherwise), never more: a longer one lets a resend come after the key
    expired. ``timeout`` bounds one send, all its requests together (an action's POST and
    the reads of its outcome). ``base_url`` replaces the SDK's hosts (a test server, a
    proxy); without it, the SDK's sandbox (production with ``sandbox=False``) at your
    merchant ``subdomain``. Every call masks ``CARD_DATA`` in what is stored; ``mask=``
    adds field paths, never one reconcile reads (``amount``, ``currency``,
    ``reference``, ``payment_id``).
    """

    def __init__(
        self,
        secret_key: str,
        *,
        base_url: str | None = None,
        subdomain: str | None = None,
        sandbox: bool = True,
        processing_channel_id: str | None = None,
        timeout: float | timedelta = DEFAULT_HTTP_TIMEOUT,
        attempt_timeout: float | timedelta = DEFAULT_ATTEMPT_TIMEOUT,
        key_retention: float | timedelta = DEFAULT_KEY_RETENTION,
        name: str = "checkout",
        mask: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.timeout = http_timeout_seconds(timeout, attempt_timeout)
        retention = to_seconds(key_retention, what="key_retention")
        if retention <= 0:
            raise ValueError("key_retention must be positive: your account's idempotency window")
        self.key_retention = timedelta(seconds=retention)
        self.processing_channel_id = processing_channel_id
        self.http_client = bounded_session(self.timeout)
        self.sdk = build_sdk(secret_key, base_url, subdomain, sandbox, self.http_client)
        self._payments = self.sdk.payments
        # Checkout.com documents no limit for Cko-Idempotency-Key: no max_key_length.
        call = CallMaker(name, self.key_retention, definite_verdict(is_nothing_processed), None)
        payments, actions = adapter_policies(CARD_DATA, mask)
        charge, authorize = (partial(self._request_payment, capture=c) for c in (True, False))
        self.charge = call("charge", charge, self._reconcile_payment, payments)
        self.authorize = call("authorize", authorize, self._reconcile_payment, payments)
        self.capture, self.refund, self.void = (
            call(
                kind,
                partial(self._send_action, kind=kind),
                partial(self._reconcile_action, kind=kind),
                actions,
            )
            for kind in _ACTION_TYPES
        )

    # --- the checklist's probes ------------------------------------------------------------

    def _checklist_request(self, amount: int, key: str) -> dict[str, Any]:
        """A charge of the test card, referenced by the key."""
        source = {**TEST_CARD, "expiry_year": datetime.now().year + 3}
        return {"amount": amount, "currency": "usd", "reference": key, "source": source}

    def lookup(self, idempotency_key: str) -> dict[str, Any] | None:
        """The payment ``send`` made under the key (listed by the key as reference), or None."""
        mark = key_mark(idempotency_key)
        found, _ = self._payments_by_reference(idempotency_key)
        mine = [p for p in found if not declined(p) and marked_key(p) == mark]
        return payment_result(mine[0]) if mine else None

    # --- sends ------------------------------------------------------------------------------

    def _request_payment(self, call: CallContext, *, capture: bool) -> dict[str, Any]:
        request, key = request_checks.mapping(call.request, "charge"), call.idempotency_key
        if "capture" in request:
            raise CheckoutRequestError("capture is the call's own: use charge, or authorize")
        body = {k: v for k, v in request.items() if k not in ("source", "metadata")}
        amount, currency = request_checks.amount(request), request_checks.currency(request).upper()
        body.update(source=source_of(request.get("source")))
        body.update(amount=to_gateway(amount, currency, CHECKOUT_UNITS))  # refused here
        reference = request_checks.text(request, "reference")
        body.update(currency=currency, reference=reference)
        body.update(capture=capture, metadata=metadata_with_key(request, key))
        if self.processing_channel_id is not None:
            body.setdefault("processing_channel_id", self.processing_channel_id)
        with one_send(self.timeout):
            reply = self._sdk("the payment", self._payments.request_payment, body, key)
            payment = as_dict(reply)
            # A 201 carries no metadata, so no key: amount, currency and reference tell.
            wanted = PaymentFacts(amount, currency, reference)
            if payment.get("status") == PENDING:  # a 202: the payment it names tells
                payment = self._accepted_payment(payment, reference)
                wanted = PaymentFacts(amount, currency, reference, key_mark(key))
        refuse_another_requests_answer(
            f"Checkout.com's payment {payment.get('id')}", wanted, _facts(payment)
        )
        if declined(payment):
            details = {k: payment.get(k) for k in ("response_code", "response_summary")}
            raise CheckoutDeclinedError(
                f"Checkout.com declined payment {payment.get('id')}: "
                f"{details['response_code']} {details['response_summary']}",
                {"payment_id": payment.get("id"), **details},
            )
        return payment_result(payment)

    def _accepted_payment(self, accepted: dict[str, Any], reference: str) -> dict[str, Any]:
        """The payment a 202 ``Pending`` names (3-D Secure, an asynchronous method), read
        by its id: the 202 carries its id, status, reference and links only, no amount,
        currency or ``approved``. A reference it carries is compared first; a failed read
        leaves the outcome unknown, as the payment exists."""
        payment_id = accepted.get("id")
        what = f"Checkout.com's Pending payment {payment_id}"
        if accepted.get("reference") is not None:
            found = PaymentFacts(reference=accepted.get("reference"))
            refuse_another_requests_answer(what, PaymentFacts(reference=reference), found)
        try:
            if not isinstance(payment_id, str) or not payment_id:
                raise ValueError("the 202 names no payment id")
            return self._details(payment_id)
        except Exception as exc:
            raise CheckoutNoAnswerError(
                f"Checkout.com accepted the payment as Pending, but reading it failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _send_action(self, call: CallContext, kind: str) -> dict[str, Any]:
        request, key = request_checks.mapping(call.request, kind), call.idempotency_key
        payment_id = request_checks.text(request, "payment_id")
        body = {k: v for k, v in request.items() if k not in ("payment_id", "metadata")}
        amount = None if body.get("amount") is None else request_checks.amount(body)
        body.pop("amount", None)
        body["metadata"] = metadata_with_key(request, key)
        post = getattr(self._payments, f"{kind}_payment")
        with one_send(self.timeout):
            if amount is not None:
                # In Checkout.com's units for the payment's currency, read first (an action
                # names none): refused before the action when it cannot be written.
                currency = self._details(payment_id).get("currency")
                body["amount"] = to_gateway(amount, str(currency or ""), CHECKOUT_UNITS)
            try:
                reply = self._sdk(f"the {kind} of {payment_id}", post, payment_id, body, key)
            except CheckoutRefusedError as refused:
                if refused.status not in (403, 422):
                    raise
                # Also Checkout.com's answer to an action already done: definite only once
                # the payment lists none under this key.
                done = self._outcome(payment_id, kind, key, None, f"refused ({refused})")
                if done is None:
                    raise
                return _own_action(kind, payment_id, amount, done)
            answered = as_dict(reply)
            action_id = answered.get("action_id")
            # A key's 202 is replayed whoever sent it first: read the payment it names.
            paid = linked_id(answered.get("_links"), "payment") or payment_id
            found = self._outcome(paid, kind, key, action_id, f"accepted ({action_id})")
            if found is None:
                raise CheckoutNoAnswerError(f"{paid} does not list {kind} {action_id}")
            return _own_action(kind, payment_id, amount, found)

    def _outcome(
        self, payment_id: str, kind: str, key: str, action_id: Any, answer: str
    ) -> dict[str, Any] | None:
        """The action (by its id, else by the key) as a result, or None; a read that fails
        leaves the outcome unknown."""
        try:
            actions = self._actions(payment_id)
            if action_id:
                found = [a for a in actions if a.get("id") == action_id]
            else:  # also a repeat of a completed action, answered without its id
                found = approved_first(self._under_key(actions, kind, key))
            return self._action_result(payment_id, found[0]) if found else None
        except Exception as exc:
            raise CheckoutNoAnswerError(
                f"Checkout.com {answer} the {kind} of {payment_id}, but reading its outcome "
                f"failed: {type(exc).__name__}: {exc}"
            ) from exc

    # --- the SDK and its reads ----------------------------------------------------------------

    def _sdk(self, what: str, method: Callable[..., Any], *args: Any) -> Any:
        """One SDK call; its errors become what a verdict (and a replayed failure) needs."""
        try:
            return method(*args)
        except CheckoutApiException as exc:
            status = status_code(exc)
            if status not in _DEFINITE_STATUSES:
                raise
            codes = [str(code) for code in exc.error_details or []]
            details = {"status": status, "error_type": exc.error_type, "error_codes": codes}
            raise CheckoutRefusedError(
                f"Checkout.com refused {what}: HTTP {status} {exc.error_type or ''} {codes}",
                {**details, "request_id": exc.request_id},
            ) from exc
        except (CheckoutArgumentException, CheckoutAuthorizationException):
            raise
        except CheckoutException as exc:  # the SDK's wrapper of requests' errors
            cause = exc.__cause__
            raise CheckoutNoAnswerError(
                f"no answer from Checkout.com to {what}: {type(cause).__name__}: {cause}"
            ) from exc

    def _payments_by_reference(self, reference: str) -> tuple[list[dict[str, Any]], bool]:
        """Every payment listed for the reference, and whether that was all of them."""
        found: list[dict[str, Any]] = []
        for skip in range(0, _PAGE * _MAX_PAGES, _PAGE):
            query = {"reference": reference, "limit": _PAGE, "skip": skip}
            reply = as_dict(self._sdk("the list", self._payments.get_payments_list, query))
            data = [p for p in reply.get("data") or [] if isinstance(p, dict)]
            found.extend(data)
            total = reply.get("total_count")
            if len(data) < _PAGE or (isinstance(total, int) and len(found) >= total):
                return found, True
        return found, False

    def _actions(self, payment_id: str) -> list[dict[str, Any]]:
        read = self._payments.get_payment_actions
        reply = plain(self._sdk(f"the actions of {payment_id}", read, payment_id))
        items = reply.get("items") if isinstance(reply, dict) else reply
        return [a for a in items or [] if isinstance(a, dict)]

    @staticmethod
    def _under_key(actions: list[dict[str, Any]], kind: str, key: str) -> list[dict[str, Any]]:
        mark = key_mark(key)
        return [
            a for a in actions if a.get("type") == _ACTION_TYPES[kind] and marked_key(a) == mark
        ]

    def _details(self, payment_id: str) -> dict[str, Any]:
        read = self._payments.get_payment_details
        return as_dict(self._sdk(f"payment {payment_id}", read, payment_id))

    def _action_result(self, payment_id: str, action: Mapping[str, Any]) -> dict[str, Any]:
        """What capture, refund and void return, from send and reconcile alike (the amount
        in ISO 4217 minor units, as the request's)."""
        payment = self._details(payment_id)
        return {
            "id": payment_id,
            "action_id": action.get("id"),
            "type": action.get("type"),
            "status": payment.get("status"),
            "amount": iso_amount(action.get("amount"), payment.get("currency")),
            "currency": str(payment.get("currency") or "").lower(),
            "reference": action.get("reference"),
            # A declined action (``approved: false``) moved no money: send raises it.
            **{field: action.get(field) for field in _DECLINE_FIELDS},
        }

    # --- reconcile --------------------------------------------------------------------------

    def _reconcile_payment(self, call: CallContext, lookup: Lookup) -> ReconcileAnswer:
        """The payments listed for the reference: the one that carries this call's key
        and matches the request is this call's. Another call's key is another call's
        payment; one with no key, or ours with another amount or currency, is not taken
        for this one (``Unknown``: an operator decides)."""
        request = request_checks.mapping(lookup.request, "charge")
        reference, currency = (
            request_checks.text(request, "reference"),
            request_checks.currency(request).upper(),
        )
        amount, mark = request_checks.amount(request), key_mark(lookup.idempotency_key)
        found, complete = self._payments_by_reference(reference)
        if not complete:
            return Unknown(f"over {_PAGE * _MAX_PAGES} payments carry reference {reference!r}")
        wanted = request_facts(request, mark)
        # Another call's key marks another call's payment: only ours, or none, can be.
        listed = [p for p in found if not declined(p) and marked_key(p) in (None, mark)]
        answer = adopt_one_of(
            wanted,
            [(f"payment {p.get('id')}", _facts(p), payment_result(p)) for p in listed],
        )
        if answer is not None:
            return answer
        what = f"of {amount} {currency} with reference {reference!r}"
        return self._absent(lookup, f"no payment {what}")

    def _reconcile_action(self, call: CallContext, lookup: Lookup, kind: str) -> ReconcileAnswer:
        payment_id = request_checks.text(request_checks.mapping(lookup.request, kind), "payment_id")
        actions = self._actions(payment_id)
        found = self._under_key(actions, kind, lookup.idempotency_key)
        # A declined action moved no money: never this call's result.
        mine = [a for a in found if a.get("approved") is not False]
        if len(mine) == 1:
            what = f"Checkout.com's {kind} {mine[0].get('id')} of {payment_id}"
            result = self._action_result(payment_id, mine[0])
            whole = partial(self._all_of_it, kind, payment_id, mine[0], actions)
            asked = request_facts(lookup.request).amount
            return adopt_action(what, asked, whole, _action_facts(result), result)
        if mine:
            ids = ", ".join(str(a.get("id")) for a in mine)
            return Unknown(f"{len(mine)} {kind} actions on {payment_id} carry this key: {ids}")
        if found:
            return Unknown(declined_reason(kind, payment_id, found))
        return self._absent(lookup, f"payment {payment_id} lists no {kind} under this key")

    def _all_of_it(self, kind: str, payment_id: str, action: Any, actions: list[Any]) -> Any:
        """What a capture or refund without an amount took (``left_when_made``): what was
        left when it was made, read from the payment now."""
        if kind == "void":
            return None
        return left_when_made(kind, self._details(payment_id), action, actions)

    def _absent(self, lookup: Lookup, why: str) -> ReconcileAnswer:
        """A miss is NotSent only while the key surely lives: a resend under it is then
        processed afresh if nothing was, and replayed if a 2xx was saved."""
        age = lookup.key_age
        if age is None:
            return Unknown(f"{why}; the key's age is unknown, so a resend may not be deduplicated")
        if age >= self.key_retention:
            return Unknown(
                f"{why}; the key is {age} old, past the account's {self.key_retention} "
                "retention, so a resend would not be deduplicated"
            )
        return NotSent()


__all__ = [
    "CARD_DATA",
    "DEFAULT_KEY_RETENTION",
    "KEY_METADATA_FIELD",
    "TEST_CARD",
    "BoundedHTTPAdapter",
    "CheckoutAdapter",
    "CheckoutAdapterError",
    "CheckoutDeclinedError",
    "CheckoutNoAnswerError",
    "CheckoutRefusedError",
    "CheckoutRequestError",
    "is_nothing_processed",
]
