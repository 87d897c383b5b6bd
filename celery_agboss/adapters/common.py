"""What every gateway adapter shares: its shape, its timeouts, its error verdicts and
how it tells its own payment from another.

An adapter is the one place where a gateway's errors become "nothing was processed"
(definite: the call may be sent again under the same key) or "it may have been"
(unknown: reconcile asks the gateway first). Getting that wrong is a double charge, so
every adapter routes its verdict through :func:`definite_verdict`, where a test's
sabotage switch can turn every error definite and show the second payment.

It is also where a payment the gateway shows, or answers again under a key, is taken for the
request's own: a reconcile never adopts a payment that is not this request's
(design: only the request's payment). One rule, :func:`differences`, compares amount,
currency, reference and our key (where the gateway keeps it) with the stored request:
reconcile answers ``Unknown`` naming what differed (:func:`adopt`), and a send whose answer
is another request's (a key another deployment used first, replayed by the gateway) raises
:class:`AnotherRequestsAnswerError` (:func:`refuse_another_requests_answer`).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from celery_agboss.core import sabotage
from celery_agboss.core.durations import to_seconds
from celery_agboss.core.keys import fit_key
from celery_agboss.core.masking import MaskingPolicy
from celery_agboss.core.outbound import (
    CallContext,
    Completed,
    Lookup,
    OutboundCall,
    ReconcileAnswer,
    Unknown,
)
from celery_agboss.core.protections import ADOPTS_ANY_PAYMENT, EVERY_ERROR_DEFINITE
from celery_agboss.core.transitions import policy_of
from celery_agboss.errors import MaskingPolicyError

DEFAULT_HTTP_TIMEOUT = 30.0
DEFAULT_ATTEMPT_TIMEOUT = 120.0  # agboss_attempt_timeout's default


@runtime_checkable
class GatewayAdapter(Protocol):
    """What ``celery -A proj agboss checklist --adapter module:object`` probes.

    ``send`` makes one payment of ``amount`` (minor units) under ``idempotency_key``
    through the adapter's own charge path; ``lookup`` answers what that key made, or
    None when the gateway shows nothing (raise when the gateway cannot be asked);
    ``reconcile`` is what the charge's reconcile answers about a request of ``amount``
    made as ``send`` makes its own, under a key sent a moment ago (design: OWN).
    """

    name: str

    def send(self, amount: int, idempotency_key: str) -> Any: ...

    def lookup(self, idempotency_key: str) -> Any: ...

    def reconcile(self, amount: int, idempotency_key: str) -> Any: ...

    @property
    def calls(self) -> tuple[OutboundCall, ...]: ...


def require_sdk(module: str, *, pip_extra: str, gateway: str) -> None:
    """Refuse, naming the extra to install, when the gateway's SDK is missing.

    Called by an adapter module before it imports its SDK, so the error says what to do
    instead of naming a module the user never heard of.
    """
    if importlib.util.find_spec(module) is None:
        raise ImportError(
            f"celery_agboss.adapters.{pip_extra} talks to {gateway} through its official SDK "
            f"({module!r}), which is not installed: pip install 'celery_agboss[{pip_extra}]'",
            name=module,
        )


def http_timeout_seconds(
    timeout: float | timedelta, attempt_timeout: float | timedelta = DEFAULT_ATTEMPT_TIMEOUT
) -> float:
    """The SDK's HTTP timeout, refused unless it is positive and below ``attempt_timeout``.

    A send the SDK keeps waiting on past the attempt's bound outlives the lease that
    covers it: another worker may then reconcile and resend while it still waits.
    """
    seconds = to_seconds(timeout, what="timeout")
    bound = to_seconds(attempt_timeout, what="attempt_timeout")
    if not 0 < seconds < bound:
        raise ValueError(
            f"the adapter's HTTP timeout ({seconds:g} s) must be positive and below "
            f"agboss_attempt_timeout ({bound:g} s): pass timeout=... lower, or "
            "attempt_timeout= the value your app sets"
        )
    return seconds


def definite_verdict(classify: Callable[[BaseException], bool]) -> Callable[[BaseException], bool]:
    """``is_definite_failure`` for an OutboundCall, from the adapter's own ``classify``.

    :class:`AnotherRequestsAnswerError` is definite for every adapter. Under the
    ``adapter-every-error-definite`` sabotage (tests only) every error is definite, so
    the test guarding the classification can show the double charge.
    """

    def is_definite_failure(exc: BaseException) -> bool:
        if sabotage.active(EVERY_ERROR_DEFINITE):
            return True
        return isinstance(exc, AnotherRequestsAnswerError) or classify(exc)

    is_definite_failure.__doc__ = classify.__doc__
    return is_definite_failure


# --- what is stored: card data never, what reconcile compares always --------------------

PAYMENT_KEPT = ("amount", "currency", "reference")
"""What every charge's and authorisation's policy keeps: what reconcile compares."""

ACTION_KEPT = ("payment_id", "amount", "currency")
"""What every capture's, refund's and void's policy keeps: the payment it acts on and
how much, which reconcile reads and compares."""


def adapter_policy(
    card_data: Sequence[str], kept: Sequence[str], mask: Iterable[str]
) -> MaskingPolicy:
    """The masking policy of an adapter's call (design: masking): the card data its gateway's
    API can carry (``card_data``, the adapter's own), plus the paths the user adds with
    ``mask=``, never what reconcile reads (``kept``: a ``mask=`` path that would hide it
    is refused here, when the adapter is built)."""
    if isinstance(mask, str):
        raise MaskingPolicyError(
            f"mask= takes a list of field paths, not one str: mask=[{mask!r}]", policy="mask"
        )
    return MaskingPolicy(mask=[*card_data, *mask], keep_for_reconcile=kept)


def adapter_policies(
    card_data: Sequence[str], mask: Iterable[str], *, payment_kept: Sequence[str] = PAYMENT_KEPT
) -> tuple[MaskingPolicy, MaskingPolicy]:
    """The policies of an adapter's payments (charge, authorize: ``payment_kept``) and of
    its actions on a payment (capture, refund, void: ``ACTION_KEPT``), from one ``mask=``
    (read once: it may be an iterator; a str is left for :func:`adapter_policy` to refuse)."""
    extra = tuple(mask) if not isinstance(mask, str) else mask
    return (
        adapter_policy(card_data, payment_kept, extra),
        adapter_policy(card_data, ACTION_KEPT, extra),
    )


def result_id(result: Any) -> Any:
    """A call's transaction id: its result's ``id``."""
    return result["id"]


@dataclass(frozen=True)
class CallMaker:
    """What an adapter's calls share, so each is named by its kind, send, reconcile and
    policy only: ``<adapter>.<kind>``, the gateway's key retention (a call may keep its
    own), the adapter's error verdict and its limit on a key's length."""

    adapter: str
    key_retention: timedelta
    is_definite_failure: Callable[[BaseException], bool]
    max_key_length: int | None
    transaction_id: Callable[[Any], Any] = result_id

    def __call__(
        self,
        kind: str,
        send: Callable[[CallContext], Any],
        reconcile: Callable[..., Any],
        policy: MaskingPolicy,
        key_retention: timedelta | None = None,
    ) -> OutboundCall:
        return OutboundCall(
            name=f"{self.adapter}.{kind}",
            send=send,
            reconcile=reconcile,
            key_retention=self.key_retention if key_retention is None else key_retention,
            is_definite_failure=self.is_definite_failure,
            max_key_length=self.max_key_length,
            mask=policy,
            transaction_id=self.transaction_id,
        )


class AdapterCalls:
    """What every adapter has besides its five calls: ``calls``, and the checklist's
    ``send`` and ``reconcile`` probes (:class:`GatewayAdapter`), both through its own
    ``charge`` under the key as the core fits it. An adapter says what its test charge
    is (``_checklist_request``)."""

    charge: OutboundCall
    authorize: OutboundCall
    capture: OutboundCall
    refund: OutboundCall
    void: OutboundCall

    @property
    def calls(self) -> tuple[OutboundCall, ...]:
        return (self.charge, self.authorize, self.capture, self.refund, self.void)

    def _checklist_request(self, amount: int, key: str) -> dict[str, Any]:
        raise NotImplementedError

    def send(self, amount: int, idempotency_key: str) -> Any:
        """One test charge through ``charge``'s own send path."""
        key = fit_key(idempotency_key, self.charge.max_key_length)
        request = self._checklist_request(amount, key)
        return self.charge.send(CallContext(key, request, 1, self.charge.name))

    def reconcile(self, amount: int, idempotency_key: str) -> ReconcileAnswer:
        """``charge``'s reconcile about a request of ``amount`` made as ``send`` makes its own."""
        key = fit_key(idempotency_key, self.charge.max_key_length)
        return reconcile_as_stored(self.charge, key, self._checklist_request(amount, key))


# --- this request's payment, or another's ---------------------------------------------


@dataclass(frozen=True)
class PaymentFacts:
    """What tells one payment (or action on one) from another: of the stored request, or
    of what the gateway shows. ``None`` in a request's facts is not compared (a capture
    without an amount); ``key`` is our idempotency key as the gateway keeps it (in
    metadata), and None in a request's facts where the gateway keeps none. An action's
    facts also name the ``payment`` it acts on and its ``kind`` (capture, refund, void)."""

    amount: int | None = None
    currency: str | None = None
    reference: str | None = None
    key: str | None = None
    payment: str | None = None
    kind: str | None = None


def request_facts(request: Any, key: str | None = None) -> PaymentFacts:
    """The facts of a charge's request as stored (masked: the adapters' policies keep
    ``amount``, ``currency`` and ``reference``), with our key where the gateway keeps it."""
    given: Mapping[str, Any] = request if isinstance(request, Mapping) else {}
    amount = given.get("amount")
    currency = given.get("currency")
    reference = given.get("reference")
    return PaymentFacts(
        amount=amount if isinstance(amount, int) and not isinstance(amount, bool) else None,
        currency=currency if isinstance(currency, str) else None,
        reference=reference if isinstance(reference, str) else None,
        key=key,
    )


def differences(request: PaymentFacts, found: PaymentFacts) -> list[str]:
    """What differs between the request and the payment the gateway shows: empty when it
    is this request's. Currencies compare without case (gateways write them both ways).
    Messages never quote a key: it holds the business key."""
    found_differ = []
    if request.amount is not None and found.amount != request.amount:
        found_differ.append(f"amount {found.amount!r}, not {request.amount!r}")
    if request.currency is not None and (found.currency or "").lower() != request.currency.lower():
        found_differ.append(f"currency {found.currency!r}, not {request.currency!r}")
    if request.reference is not None and found.reference != request.reference:
        found_differ.append(f"reference {found.reference!r}, not {request.reference!r}")
    if request.payment is not None and found.payment != request.payment:
        found_differ.append(f"payment {found.payment!r}, not {request.payment!r}")
    if request.kind is not None and (found.kind or "").lower() != request.kind.lower():
        found_differ.append(f"a {found.kind!r} action, not a {request.kind!r}")
    if request.key is not None and found.key != request.key:
        found_differ.append(
            "no key of ours (made outside this call: a payment link, a manual charge)"
            if found.key is None
            else "another call's key"
        )
    return found_differ


def _compared(request: PaymentFacts, found: PaymentFacts) -> list[str]:
    return [] if sabotage.active(ADOPTS_ANY_PAYMENT) else differences(request, found)


_ADVICE = (
    "Another deployment sharing this tenant (agboss_tenant) on the account, or a payment "
    "made by hand? Check the account, then resolve"
)


def adopt_one_of(
    request: PaymentFacts, candidates: Sequence[tuple[str, PaymentFacts, Any]]
) -> Completed[Any] | Unknown | None:
    """Reconcile's answer from the payments the gateway shows for a request, each
    ``(how to name it, its facts, its result)``: ``Completed`` with the one that is this
    request's; ``Unknown`` when several could be, or when none is (naming what differed,
    for an operator); None when the gateway shows none."""
    if not candidates:
        return None
    taken = [(what, result) for what, facts, result in candidates if not _compared(request, facts)]
    if len(taken) == 1:
        return Completed(taken[0][1])
    if taken:
        names = ", ".join(what for what, _ in taken)
        return Unknown(f"{len(taken)} payments could be this request's: {names}. {_ADVICE}")
    described = "; ".join(
        f"{what}: {', '.join(_compared(request, facts))}" for what, facts, _ in candidates
    )
    return Unknown(f"not this request's payment ({described}): not taken for it. {_ADVICE}")


def adopt(
    what: str, request: PaymentFacts, found: PaymentFacts, result: Any
) -> Completed[Any] | Unknown:
    """Reconcile's answer for the one payment the gateway shows: ``Completed(result)`` when
    it is this request's, else ``Unknown`` naming what differed (an operator decides)."""
    answer = adopt_one_of(request, [(what, found, result)])
    assert answer is not None
    return answer


def adopt_unchecked(what: str, why: str, result: Any) -> Completed[Any] | Unknown:
    """Reconcile's answer when the gateway shows an action under our key but not enough to
    tell whether it is this request's (``why``): ``Unknown``, never taken on trust
    (design: only the request's payment)."""
    if sabotage.active(ADOPTS_ANY_PAYMENT):
        return Completed(result)
    return Unknown(f"{what}: {why}, so it is not taken for this request. {_ADVICE}")


def adopt_action(
    what: str,
    asked: int | None,
    whole: Callable[[], int | str | None],
    found: PaymentFacts,
    result: Any,
) -> Completed[Any] | Unknown:
    """Reconcile's answer for a capture, refund or void found under our key: its amount
    compared with the request's, or, when the request names none ("all of it"), with what
    ``whole()`` says all of it was when the action was made (None: nothing to compare, a
    void; a str: why that cannot be told, ``Unknown``) (design: only the request's payment)."""
    amount = whole() if asked is None else asked
    if isinstance(amount, str):
        return adopt_unchecked(what, amount, result)
    return adopt(what, PaymentFacts(amount=amount), found, result)


def left_before(
    total: Any, mine: Mapping[str, Any], others: Iterable[Mapping[str, Any]], when: str
) -> int | str:
    """What an action on "all that is left" (a refund without an amount) would have taken
    when ``mine`` was made: ``total`` less the amounts of the ``others`` (those that count:
    the caller drops failed ones; ``mine`` is skipped) made before it, by their ``when``. A
    reason instead when that cannot be told: no total, or another action made at the same
    time as ``mine`` (which came first is not known)."""
    at, listed = mine.get(when), [other for other in others if other is not mine]
    if isinstance(total, bool) or not isinstance(total, int):
        return f"its amount could not be checked (the payment's total is {total!r})"
    if at is None or any(other.get(when) in (at, None) for other in listed):
        return "its amount could not be checked (another was made at the same time)"
    return total - sum(int(o.get("amount") or 0) for o in listed if o[when] < at)


def linked_id(links: Any, rel: str) -> str | None:
    """The id a gateway's answer links to as ``rel`` (the last segment of its href), from
    a list of ``{"rel", "href"}`` (PayPal) or a HAL ``_links`` map (Checkout.com); None
    when the answer has no such link."""
    if isinstance(links, Mapping):
        link = links.get(rel)
    else:
        listed = links if isinstance(links, list) else []
        link = next((k for k in listed if isinstance(k, Mapping) and k.get("rel") == rel), None)
    href = link.get("href") if isinstance(link, Mapping) else None
    if not isinstance(href, str) or not href.strip("/"):
        return None
    return href.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def reconcile_as_stored(call: OutboundCall, idempotency_key: str, request: Any) -> ReconcileAnswer:
    """What ``call``'s reconcile answers about ``request`` sent under ``idempotency_key`` a
    moment ago (key age 0), handed the request as the store keeps it: masked by the
    call's policy, as on every real path. The adapters' ``reconcile`` probe."""
    stored = policy_of(call).mask_request(request)
    lookup = Lookup(idempotency_key, stored, 1, None, timedelta(0))
    return call.reconcile(CallContext(idempotency_key, request, 1, call.name), lookup)


class RequestChecks:
    """The checks of a request dict an adapter makes before anything is sent, the same
    rules for every gateway; a refusal is the adapter's own ``ValueError`` (made by
    ``refuse`` from the message), naming the field: definite, nothing sent."""

    def __init__(self, refuse: Callable[[str], ValueError]) -> None:
        self._refuse = refuse

    def mapping(self, request: Any, kind: str | None = None) -> Mapping[str, Any]:
        """``request`` as a dict; ``kind`` names the call in the refusal."""
        if not isinstance(request, Mapping):
            what = "the request" if kind is None else f"a {kind} request"
            raise self._refuse(f"{what} must be a dict, not {type(request).__name__}")
        return request

    def amount(self, request: Mapping[str, Any], field: str = "amount") -> int:
        value = request.get(field)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self._refuse(f"{field!r} must be a positive int in minor units, not {value!r}")
        return value

    def text(self, request: Mapping[str, Any], field: str) -> str:
        value = request.get(field)
        if not isinstance(value, str) or not value:
            # The type only: a wrong value here may be anything, card data included.
            given = "an empty str" if value == "" else type(value).__name__
            raise self._refuse(f"{field!r} must be a non-empty str, not {given}")
        return value

    def currency(self, request: Mapping[str, Any]) -> str:
        """The ISO 4217 code as given (the gateways take it upper case)."""
        value = request.get("currency")
        if not isinstance(value, str) or len(value) != 3 or not value.isalpha():
            raise self._refuse(f"'currency' must be a three-letter ISO code, not {value!r}")
        return value


class AnotherRequestsAnswerError(Exception):
    """The gateway answered a send with a payment that is not this request's: it replayed
    the first answer of another request made under the same key (a deployment sharing
    this tenant on one account). Nothing was processed for this request, and the same
    key will never be: definite, for every adapter. The message names what differed."""

    def __init__(self, message: str, differences: list[str] | None = None) -> None:
        super().__init__(message)
        self.differences = list(differences or [])

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.differences))


def refuse_another_requests_answer(what: str, request: PaymentFacts, found: PaymentFacts) -> None:
    """Raise :class:`AnotherRequestsAnswerError` unless ``found`` (what a send answered)
    is this request's payment."""
    found_differ = _compared(request, found)
    if found_differ:
        raise AnotherRequestsAnswerError(
            f"{what} answered a payment that is not this request's ({'; '.join(found_differ)}): "
            "the gateway replayed another request made under this key (another deployment "
            "sharing this tenant on the account?); nothing was processed for this one",
            found_differ,
        )


ADYEN_PSP_REFERENCE = re.compile(r"[0-9A-Za-z]{16}")
"""Adyen's pspReference: "Adyen's 16-character string reference associated with the
transaction/request" (the Checkout API reference, PaymentResponse's ``pspReference``;
docs.adyen.com/reporting/modifications-not-processed), letters and digits in every
example Adyen gives ("F7WCWRG6JPHR8HG2", docs.adyen.com/development-resources/
error-codes). The adapter sends a ``payment_id`` of this shape only (it is a segment of
the URL path); the webhook verifier asks it of a payment's notifications. Here, with no
SDK imported, so that both read one rule."""


__all__ = [
    "ACTION_KEPT",
    "ADYEN_PSP_REFERENCE",
    "DEFAULT_ATTEMPT_TIMEOUT",
    "DEFAULT_HTTP_TIMEOUT",
    "PAYMENT_KEPT",
    "AdapterCalls",
    "AnotherRequestsAnswerError",
    "CallMaker",
    "GatewayAdapter",
    "PaymentFacts",
    "adapter_policies",
    "adapter_policy",
    "adopt",
    "adopt_one_of",
    "definite_verdict",
    "differences",
    "http_timeout_seconds",
    "reconcile_as_stored",
    "refuse_another_requests_answer",
    "request_facts",
    "require_sdk",
    "result_id",
]
