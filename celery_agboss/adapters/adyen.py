"""Adyen (Checkout API v72) as outbound calls, through the official ``Adyen`` SDK 16.x.

Adyen is named only to identify its public API; this adapter is not affiliated with or
endorsed by Adyen.

Adyen deduplicates ``Idempotency-Key`` (at most 64 characters) on every POST and
answers a repeat with the first response, keeping keys "7 to 14 days"; Checkout v72
has no read API for a payment. So reconcile cannot look anything up: inside the
7-day window it answers ``NotSent()`` and the resend replays the key (Adyen returns
the first answer, or processes a request it never received); past the window, or when
the key's age is unknown, only a person can tell, and it answers ``Unknown``.

When Adyen's idempotency store is down (error 703) its docs suggest resending without
a key. This adapter never does: 703 is an unknown outcome, and every request carries
its key.

A resend's answer is the key's first answer, whoever sent it (Adyen documents no refusal
of a key reused with another request): an answer whose amount, currency or reference (a
modification's: amount, currency or ``paymentPspReference``) is not the request's is
another request's, never taken for this one
(``AnotherRequestsAnswerError``, definite: nothing was processed for this request).

A resend follows a ``NotSent`` that proved nothing, so on a resend only Adyen's answers
under the key (a ``Refused``, another request's answer) stay definite; a refusal it can
give before reading the key (401, 403, 404, a validation) leaves the outcome unknown
(``ResendRefusedError``, ``celery_agboss.adapters.resends``).
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from celery_agboss.adapters.common import require_sdk

require_sdk("Adyen", pip_extra="adyen", gateway="Adyen")

from Adyen.client import AdyenClient
from Adyen.exceptions import (
    AdyenAPIResponseError,
    AdyenEndpointInvalidFormat,
    AdyenInvalidRequestError,
)
from Adyen.services.checkout import ModificationsApi, PaymentsApi

from celery_agboss.adapters.adyen_requests import ADYEN_UNITS, AdyenRequestError
from celery_agboss.adapters.common import (
    ADYEN_PSP_REFERENCE,
    DEFAULT_ATTEMPT_TIMEOUT,
    DEFAULT_HTTP_TIMEOUT,
    AdapterCalls,
    CallMaker,
    PaymentFacts,
    RequestChecks,
    adapter_policies,
    definite_verdict,
    http_timeout_seconds,
    refuse_another_requests_answer,
)
from celery_agboss.adapters.minor_units import from_gateway, to_gateway
from celery_agboss.adapters.resends import UnprovenResends
from celery_agboss.core.outbound import (
    CallContext,
    Lookup,
    NotSent,
    Unknown,
)

CHECKOUT_API_VERSION = "v72"
KEY_RETENTION = timedelta(days=7)
"""Adyen: keys are valid "7 to 14 days" (API idempotency page): the lowest value."""
MAX_KEY_LENGTH = 64
IN_PROGRESS_CODE = "704"  # "request already processed or in progress": it may have been
IDEMPOTENCY_UNAVAILABLE_CODE = "703"  # the key store is down: never resend without the key
TEST_CARD: Mapping[str, str] = {
    # Adyen's documented unencrypted test values for a Visa test card (test platform only).
    "type": "scheme",
    "encryptedCardNumber": "test_4111111111111111",
    "encryptedExpiryMonth": "test_03",
    "encryptedExpiryYear": "test_2030",
    "encryptedSecurityCode": "test_737",
}

CARD_DATA = ("source",)
"""What the policy of every call masks by default: ``source``, the ``paymentMethod``, where
a raw card's ``number``, ``expiryMonth``, ``expiryYear``, ``cvc`` and ``holderName`` go
(Adyen takes them from PCI-compliant merchants), as do their encrypted forms and a
stored payment method's id."""

_REFUSAL_FIELDS = (
    "pspReference",
    "resultCode",
    "refusalReason",
    "refusalReasonCode",
    "merchantReference",
    "amount",
)
"""What a refusal keeps of Adyen's answer (it is stored with the failure): never its
``additionalData``, which can name the card's holder, expiry and digits."""

# Statuses Adyen answers before processing anything: validation, authentication,
# permission, an unknown route. Everything else (429, 5xx, 409, ...) may have moved money.
_NOTHING_PROCESSED_STATUSES = frozenset({400, 401, 403, 404, 422})
_UNKNOWN_CODES = frozenset({IN_PROGRESS_CODE, IDEMPOTENCY_UNAVAILABLE_CODE})

Result = dict[str, Any]


class AdyenPaymentRefused(Exception):
    """Adyen answered ``resultCode: "Refused"``: nothing was charged (a definite failure)."""

    def __init__(self, answer: Mapping[str, Any]) -> None:
        reason = answer.get("refusalReason") or "no reason given"
        code = answer.get("refusalReasonCode")
        super().__init__(f"Adyen refused the payment: {reason}" + (f" ({code})" if code else ""))
        self.answer = {key: answer[key] for key in _REFUSAL_FIELDS if key in answer}
        self.refusal_reason = reason
        self.psp_reference = answer.get("pspReference")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its answer: how the store replays the failure, and how it pickles.
        return (type(self), (self.answer,))


class AdyenUnexpectedAnswer(Exception):
    """Adyen answered something this adapter cannot settle (a resultCode such as Pending
    or Error, an action for the shopper, a body without a pspReference): the payment's
    outcome is unknown, so it is never called a failure."""

    def __init__(self, message: str, answer: Any = None) -> None:
        super().__init__(message)
        self.answer = answer

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.answer))


_check = RequestChecks(AdyenRequestError)


class AdyenLookupUnsupported(NotImplementedError):
    """Adyen's Checkout API has no payment lookup (no GET for a payment)."""


def is_nothing_processed(exc: BaseException) -> bool:
    """True only when Adyen (or the SDK, before sending) says nothing was processed.

    A refusal, a malformed request, a 400/401/403/404/422 answer, and the SDK's own
    refusals raised before any request (missing credentials, a live URL prefix not
    set). Error codes 704 (in progress) and 703 (idempotency unavailable) come with a
    422 or a 5xx but are unknown: the first request may have been processed.
    """
    if isinstance(exc, (AdyenPaymentRefused, AdyenRequestError)):
        return True
    if isinstance(exc, AdyenAPIResponseError):
        if str(exc.error_code or "") in _UNKNOWN_CODES:
            return False
        return exc.status_code in _NOTHING_PROCESSED_STATUSES
    return isinstance(exc, (AdyenInvalidRequestError, AdyenEndpointInvalidFormat))


def _sdk_http_backend() -> str:
    """``requests`` when installed (its adapter never retries), else the standard library.

    Never pycurl: the SDK hands it the timeout as is, and pycurl takes whole seconds only.
    """
    return "requests" if importlib.util.find_spec("requests") is not None else "urllib"


class AdyenAdapter(AdapterCalls):
    """``charge``, ``authorize``, ``capture``, ``refund`` and ``void`` against Adyen.

    ``base_url`` is the Checkout API's root, without the version (``/v72`` is added):
    None leaves the SDK's own (``platform="test"``: checkout-test.adyen.com; ``"live"``
    needs ``live_endpoint_prefix``). ``timeout`` is the SDK's HTTP timeout, kept below
    ``attempt_timeout``; the SDK itself never retries. Every call masks ``CARD_DATA`` in
    what is stored; ``mask=`` adds field paths, never one the adapter compares
    (``amount``, ``currency``, ``reference``, ``payment_id``).
    """

    def __init__(
        self,
        api_key: str,
        merchant_account: str,
        *,
        base_url: str | None = None,
        platform: str = "test",
        live_endpoint_prefix: str | None = None,
        timeout: float | timedelta = DEFAULT_HTTP_TIMEOUT,
        attempt_timeout: float | timedelta = DEFAULT_ATTEMPT_TIMEOUT,
        name: str = "adyen",
        mask: Iterable[str] = (),
    ) -> None:
        if not api_key or not merchant_account:
            raise ValueError("AdyenAdapter needs an api_key and a merchant_account")
        if platform not in ("test", "live"):
            raise ValueError(f"platform must be 'test' or 'live', not {platform!r}")
        if platform == "live" and base_url is None and not live_endpoint_prefix:
            raise ValueError("the live platform needs live_endpoint_prefix (or a base_url)")
        self.name = name
        self.merchant_account = merchant_account
        self.timeout = http_timeout_seconds(timeout, attempt_timeout)
        self.client = AdyenClient(
            xapikey=api_key,
            platform=platform,
            merchant_account=merchant_account,
            live_endpoint_prefix=live_endpoint_prefix,
            http_timeout=self.timeout,
            http_force=_sdk_http_backend(),
        )
        self.payments_api = PaymentsApi(client=self.client)
        self.modifications_api = ModificationsApi(client=self.client)
        if base_url is not None:
            root = base_url.rstrip("/")
            if not root.endswith(f"/{CHECKOUT_API_VERSION}"):
                root = f"{root}/{CHECKOUT_API_VERSION}"
            # The SDK's documented hook ("Customizing Base URL"): each service's baseUrl.
            self.payments_api.baseUrl = root
            self.modifications_api.baseUrl = root
        verdict = definite_verdict(is_nothing_processed)
        call = CallMaker(name, KEY_RETENTION, verdict, MAX_KEY_LENGTH)
        # Reconcile's NotSent proves nothing (no lookup): a resend's refusal before Adyen
        # reads the key is unknown; only a Refused, answered under the key, stays definite.
        resent = UnprovenResends("Adyen", verdict, (AdyenPaymentRefused,))
        payments, actions = adapter_policies(CARD_DATA, mask)
        self.charge = call("charge", resent(self._send_charge), self._reconcile, payments)
        self.authorize = call("authorize", resent(self._send_authorize), self._reconcile, payments)
        self.capture = call("capture", resent(self._send_capture), self._reconcile, actions)
        self.refund = call("refund", resent(self._send_refund), self._reconcile, actions)
        self.void = call("void", resent(self._send_void), self._reconcile, actions)

    # --- reconcile: no lookup, so the key's replay inside its window -------------------

    def _reconcile(self, call: CallContext, lookup: Lookup) -> NotSent | Unknown:
        age = lookup.key_age
        if age is None or age >= KEY_RETENTION:
            told = "is unknown" if age is None else f"is {age}"
            return Unknown(
                "Adyen has no payment lookup; the key's 7-day window passed (its age "
                f"{told}), so a resend could charge again: check the payment in the "
                "Customer Area or its webhooks"
            )
        return NotSent()  # the resend replays the key: Adyen answers the first response

    # --- the checklist's probes ---------------------------------------------------------

    def _checklist_request(self, amount: int, key: str) -> Result:
        """A test card's charge (no lookup: reconcile answers ``NotSent`` inside the key's
        window, and the resend's answer tells)."""
        return {"amount": amount, "currency": "usd", "reference": key, "source": dict(TEST_CARD)}

    def lookup(self, idempotency_key: str) -> Result | None:
        raise AdyenLookupUnsupported(
            "Adyen has no payment lookup: Checkout API v72 has no GET for a payment, so a "
            "payment cannot be found by its idempotency key or reference; reconcile "
            "replays the key inside its 7-day window, and answers unknown after it"
        )

    # --- sends ----------------------------------------------------------------------------

    def _send_charge(self, call: CallContext) -> Result:
        return self._pay(call, capture=True)

    def _send_authorize(self, call: CallContext) -> Result:
        return self._pay(call, capture=False)

    def _pay(self, call: CallContext, *, capture: bool) -> Result:
        request = _check.mapping(call.request)
        amount, currency = _check.amount(request), _check.currency(request)
        reference = _check.text(request, "reference")
        body: dict[str, Any] = {
            "merchantAccount": self.merchant_account,
            "amount": _adyen_amount(amount, currency),
            "reference": reference,
            **_payment_method(request),
        }
        if capture:
            body["captureDelayHours"] = 0
        else:
            body["additionalData"] = {"manualCapture": "true"}
        answer = self.payments_api.payments(body, idempotency_key=_key(call)).message
        if not isinstance(answer, Mapping):
            raise AdyenUnexpectedAnswer("Adyen's payment answer is not a JSON object", answer)
        code = answer.get("resultCode")
        if code == "Refused":
            raise AdyenPaymentRefused(answer)
        psp = answer.get("pspReference")
        if code != "Authorised" or not isinstance(psp, str) or not psp:
            raise AdyenUnexpectedAnswer(
                f"Adyen answered resultCode {code!r} (pspReference {psp!r}): the payment's "
                "outcome is not settled by this answer",
                dict(answer),
            )
        answered = {**body["amount"], **_amount_of(answer)}
        moved = from_gateway(answered["value"], answered["currency"], ADYEN_UNITS)
        # The answer to a resend is the key's first answer (design: G4), whoever sent it: the
        # only place this adapter can tell another request's payment from its own.
        refuse_another_requests_answer(
            f"Adyen's payment {psp}",
            PaymentFacts(amount, currency, reference),
            PaymentFacts(moved, answered["currency"], answer.get("merchantReference", reference)),
        )
        return {
            "id": psp,
            "status": "authorised",
            "amount": moved,
            "currency": str(answered["currency"]).lower(),
            "reference": answer.get("merchantReference", reference),
            "result_code": code,
            "capture": "immediate" if capture else "manual",
        }

    def _send_capture(self, call: CallContext) -> Result:
        capture = self.modifications_api.capture_authorised_payment
        payment, received = self._modify(call, capture, with_amount=True)
        return {**received, "id": payment, "capture_id": received["psp_reference"]}

    def _send_refund(self, call: CallContext) -> Result:
        refund = self.modifications_api.refund_captured_payment
        payment, received = self._modify(call, refund, with_amount=True)
        return {**received, "id": received["psp_reference"], "payment_id": payment}

    def _send_void(self, call: CallContext) -> Result:
        cancel = self.modifications_api.cancel_authorised_payment_by_psp_reference
        payment, received = self._modify(call, cancel, with_amount=False)
        return {**received, "id": payment, "cancel_id": received["psp_reference"]}

    def _modify(
        self, call: CallContext, send: Callable[..., Any], *, with_amount: bool
    ) -> tuple[str, Result]:
        """A modification of the request's ``payment_id`` sent under the call's key: the
        payment, and what Adyen answered (checked against what was sent)."""
        request = _check.mapping(call.request)
        payment = _psp_reference(request)
        body = self._modification_body(request, with_amount=with_amount)
        answer = send(body, payment, idempotency_key=_key(call)).message
        return payment, _received(answer, payment, body, call.after_possible_send)

    def _modification_body(self, request: Mapping[str, Any], *, with_amount: bool) -> Result:
        body: Result = {"merchantAccount": self.merchant_account}
        if with_amount:
            # Adyen takes the amount and currency on every capture and refund, and has no
            # read API to learn the authorised amount from: both are required here.
            if request.get("amount") is None:
                raise AdyenRequestError(
                    "'amount' is required: Adyen captures and refunds take an explicit "
                    "amount (and 'currency'), and cannot look the payment's amount up"
                )
            body["amount"] = _adyen_amount(_check.amount(request), _check.currency(request))
        if request.get("reference") is not None:
            body["reference"] = _check.text(request, "reference")
        return body


# --- request checks and answer shapes --------------------------------------------------


def _key(call: CallContext) -> str:
    # The SDK drops the header for an empty key: refuse one rather than send unkeyed.
    if not isinstance(call.idempotency_key, str) or not call.idempotency_key:
        raise AdyenRequestError("an Adyen request needs a non-empty idempotency key")
    return call.idempotency_key


def _psp_reference(request: Mapping[str, Any]) -> str:
    """The request's ``payment_id``, refused before anything is sent unless it is a
    pspReference: it is a segment of the URL path (``/payments/{it}/refunds``), where a
    ``/`` or ``?`` would make the SDK send another modification than the one asked for.
    The refusal names what is wrong, never the value (it could be anything)."""
    payment = _check.text(request, "payment_id")
    if ADYEN_PSP_REFERENCE.fullmatch(payment):
        return payment
    odd = sorted({c for c in payment if not (c.isascii() and c.isalnum())})
    shown = ", ".join(repr(c) for c in odd[:5]) if odd else "none"
    raise AdyenRequestError(
        "'payment_id' must be the pspReference Adyen answered for the payment (16 letters "
        f"or digits); this one has {len(payment)} characters, other characters: {shown}. "
        "Pass the 'id' the charge or authorize returned"
    )


def _payment_method(request: Mapping[str, Any]) -> Result:
    """``source``: a ``paymentMethod`` object as Adyen takes it, or a stored payment
    method's id (then ``shopper_reference`` is required: a card-on-file charge)."""
    source = request.get("source")
    if isinstance(source, Mapping) and source:
        return {"paymentMethod": copy.deepcopy(dict(source))}
    if isinstance(source, str) and source:
        return {
            "paymentMethod": {"type": "scheme", "storedPaymentMethodId": source},
            "shopperReference": _check.text(request, "shopper_reference"),
            "shopperInteraction": "ContAuth",
            "recurringProcessingModel": "UnscheduledCardOnFile",
        }
    raise AdyenRequestError(
        "'source' is required: a paymentMethod dict (e.g. Adyen's encrypted card fields) "
        f"or a stored payment method id, not {source!r}"
    )


def _adyen_amount(amount: int, currency: str) -> Result:
    """The request's ``amount`` (ISO 4217 minor units) as Adyen's amount object, in Adyen's
    minor units (``ADYEN_UNITS``): refused, before anything is sent, when Adyen cannot
    write it (a CVE or IDR amount that is not a multiple of 100)."""
    return {"value": to_gateway(amount, currency, ADYEN_UNITS), "currency": currency.upper()}


def _amount_of(answer: Mapping[str, Any]) -> Mapping[str, Any]:
    """An answer's ``amount`` object (``{"value", "currency"}``), or empty when absent."""
    amount = answer.get("amount")
    return amount if isinstance(amount, Mapping) else {}


def _received(
    answer: Any, payment: str, body: Mapping[str, Any], after_possible_send: bool
) -> Result:
    """A modification's 201: Adyen only says it was received; the outcome comes by webhook.
    The payment it names and its amount, when it names them, are the request's: else it
    answers another request made first under this key, another payment's capture, refund
    or cancel perhaps (design: only the request's payment). When no earlier send of
    ours under the key may have been processed, another payment named is no replay of
    ours: something else may have been modified, an unknown outcome."""
    if not isinstance(answer, Mapping):
        raise AdyenUnexpectedAnswer("Adyen's modification answer is not a JSON object", answer)
    psp = answer.get("pspReference")
    if answer.get("status") != "received" or not isinstance(psp, str) or not psp:
        raise AdyenUnexpectedAnswer(
            f"Adyen answered {answer.get('status')!r} (pspReference {psp!r}) to a "
            f"modification of {payment}",
            dict(answer),
        )
    named = answer.get("paymentPspReference", payment)
    if not after_possible_send and named != payment:
        raise AdyenUnexpectedAnswer(
            f"Adyen's modification {psp} names payment {named!r}, not {payment}, though "
            "nothing of ours under this key was processed: something else may have "
            "been modified. Check both payments in the Customer Area before resolving",
            dict(answer),
        )
    amount = _amount_of(answer)
    currency = amount.get("currency")
    asked = _amount_of(body)
    refuse_another_requests_answer(
        f"Adyen's modification {psp} of {payment}",
        PaymentFacts(asked.get("value"), asked.get("currency"), payment=payment),
        PaymentFacts(
            amount.get("value", asked.get("value")),
            currency or asked.get("currency"),
            payment=named,
        ),
    )
    value = amount.get("value")
    return {
        "status": "received",
        "psp_reference": psp,
        # In ISO 4217 minor units, as the request's (compared above in Adyen's, as sent).
        "amount": from_gateway(value, currency or asked.get("currency"), ADYEN_UNITS),
        "currency": currency.lower() if isinstance(currency, str) else None,
        "reference": answer.get("reference"),
    }


__all__ = [
    "CARD_DATA",
    "CHECKOUT_API_VERSION",
    "IDEMPOTENCY_UNAVAILABLE_CODE",
    "IN_PROGRESS_CODE",
    "KEY_RETENTION",
    "MAX_KEY_LENGTH",
    "TEST_CARD",
    "AdyenAdapter",
    "AdyenLookupUnsupported",
    "AdyenPaymentRefused",
    "AdyenRequestError",
    "AdyenUnexpectedAnswer",
    "is_nothing_processed",
]
