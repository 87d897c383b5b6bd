"""Probe a gateway adapter, one result per requirement (design: gateway requirements).

Whether a customer can be charged twice depends on what the gateway offers, so a
team checks its adapter, not the gateway's marketing: offline against
``FakeGateway`` with the capabilities it believes its gateway has, or by hand
against a sandbox. Each probe makes real requests through ``send`` (small amounts,
keys under ``key_prefix``) and reports what it saw as evidence. Late outcomes
by webhook or status API (design: G6) need the gateway's own events and are not probed.

Given the adapter's ``reconcile`` too, a sixth probe checks the adapter's side
(design: OWN, only the request's payment): a payment made under a key is never taken for a
request of another amount under that key, neither by reconcile nor from the answer a resend
replays (two deployments sharing a tenant on one account would otherwise mark an order paid
with another order's payment).

A seventh probe, RECONCILE, checks that reconcile answers what the gateway shows about
the request's own key (design: reconcile). A reconcile answering ``Completed`` for a key
never sent marks an order paid with no money taken, and one answering ``NotSent`` while
the gateway shows the key's payment has it sent again: deduplicated while the gateway
replays the key, a second charge once it does not (past its retention, which a call
declaring ``lookup_proves_absence`` never checks), and a cancel settles a paid order as
never paid. Both fail. ``NotSent`` passes where nothing can look the payment up and the
resend under the key answers the same payment (a replay-only gateway, bounded by key
age). ``Unknown`` about a payment the lookup shows is WARNED, not failed: nothing moves
twice, but every lost answer waits for an operator. Not probed: a declined payment
(``NotSent`` is right there, no money moved) and the currency (``reconcile(amount, key)``
names none).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from celery_agboss.adapters.common import AnotherRequestsAnswerError
from celery_agboss.core.outbound import Completed, NotSent, Unknown


class GatewayCheckStatus(str, enum.Enum):
    PASSED = "PASSED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"  # not probed here (the retention probe without a clock); not a failure
    WARNED = "WARNED"  # money-safe but costly (every lost answer for an operator); not a failure


@dataclass(frozen=True)
class GatewayCheckResult:
    requirement: str  # the requirement's name (design: gateway requirements, OWN, reconcile)
    status: GatewayCheckStatus
    evidence: str


@dataclass(frozen=True)
class GatewayChecklistReport:
    results: tuple[GatewayCheckResult, ...]
    key_prefix: str

    @property
    def passed(self) -> bool:
        """Nothing failed (a skipped or warned requirement is not a pass either: read its
        evidence)."""
        return all(r.status is not GatewayCheckStatus.FAILED for r in self.results)

    def result(self, requirement: str) -> GatewayCheckResult:
        for result in self.results:
            if result.requirement == requirement:
                return result
        raise KeyError(requirement)

    def statuses(self) -> dict[str, GatewayCheckStatus]:
        return {r.requirement: r.status for r in self.results}

    def __str__(self) -> str:
        return "\n".join(f"{r.requirement} {r.status.value}: {r.evidence}" for r in self.results)


class AdvanceableClock(Protocol):
    """The gateway's clock, moved forward by the retention probe (design: G3)."""

    def advance(self, seconds: float, /) -> object: ...


SendFn = Callable[[int, str], Any]
LookupFn = Callable[[str], Any]
ReconcileFn = Callable[[int, str], Any]
"""``reconcile(amount, key)``: the adapter's charge reconcile asked about a request of
``amount`` made as ``send`` makes its own, under ``key`` (sent a moment ago):
``Completed``, ``NotSent`` or ``Unknown``."""


class _ProbeError(Exception):
    def __init__(self, step: str, error: BaseException) -> None:
        super().__init__(f"{step} raised {type(error).__name__}: {error}")


def _default_payment_id(receipt: Any) -> Any:
    if isinstance(receipt, Mapping) and "id" in receipt:
        return receipt["id"]
    found = getattr(receipt, "id", None)
    return receipt if found is None else found


def gateway_checklist(
    send: SendFn,
    lookup: LookupFn | None = None,
    clock: AdvanceableClock | None = None,
    key_prefix: str | None = None,
    required_retention: float = 86400,
    *,
    amount: int = 100,
    payment_id: Callable[[Any], Any] | None = None,
    reconcile: ReconcileFn | None = None,
) -> GatewayChecklistReport:
    """Run the probes (design: gateway requirements) through the adapter's
    ``send(amount, key)`` and ``lookup(key)``, and two more after them when
    ``reconcile(amount, key)`` is given: OWN (design: OWN), then RECONCILE (design: reconcile).

    ``clock`` must be the gateway's own clock (the one ``FakeGateway`` was given): the
    retention probe (design: G3) advances it by just under ``required_retention`` seconds,
    for good. ``payment_id`` reads the payment's id from a receipt (default:
    ``receipt["id"]`` or ``.id``).
    """
    if required_retention <= 0:
        raise ValueError("required_retention must be a positive number of seconds")
    prefix = key_prefix if key_prefix is not None else f"agboss-checklist-{uuid.uuid4().hex[:12]}"
    probe = _Probe(
        send,
        lookup,
        clock,
        prefix,
        float(required_retention),
        amount,
        payment_id or _default_payment_id,
        reconcile,
    )
    checks = [
        ("G1", probe.g1),
        ("G2", probe.g2),
        ("G3", probe.g3),
        ("G4", probe.g4),
        ("G5", probe.g5),
    ]
    if reconcile is not None:
        checks.extend((("OWN", probe.own), ("RECONCILE", probe.reconcile)))
    results = []
    for requirement, check in checks:
        try:
            status, evidence = check()
        except _ProbeError as exc:
            status, evidence = GatewayCheckStatus.FAILED, str(exc)
        results.append(GatewayCheckResult(requirement, status, evidence))
    return GatewayChecklistReport(tuple(results), prefix)


Outcome = tuple[GatewayCheckStatus, str]
_PASS, _FAIL, _SKIP, _WARN = (
    GatewayCheckStatus.PASSED,
    GatewayCheckStatus.FAILED,
    GatewayCheckStatus.SKIPPED,
    GatewayCheckStatus.WARNED,
)
_NO_RECONCILE = "reconciliation cannot work"


@dataclass
class _Probe:
    send_fn: SendFn
    lookup_fn: LookupFn | None
    clock: AdvanceableClock | None
    prefix: str
    retention: float
    amount: int
    payment_id: Callable[[Any], Any]
    reconcile_fn: ReconcileFn | None = None

    def _send(self, step: str, amount: int, key: str) -> Any:
        try:
            return self.send_fn(amount, key)
        except Exception as exc:
            raise _ProbeError(step, exc) from exc

    def _twice(self, requirement: str) -> tuple[str, Any, Any]:
        key = f"{self.prefix}:{requirement.lower()}"
        first = self._send(f"the first send under {key!r}", self.amount, key)
        second = self._send(f"the repeat under {key!r}", self.amount, key)
        return key, first, second

    def g1(self) -> Outcome:
        """Two sends under one key are one payment."""
        key, first, second = self._twice("G1")
        a, b = self.payment_id(first), self.payment_id(second)
        if a == b:
            return _PASS, f"two sends under {key!r} answered one payment, {a!r}"
        return _FAIL, (
            f"two sends under {key!r} answered two payments ({a!r}, {b!r}): the key is not "
            "deduplicated, so a send retried after an error charges twice"
        )

    def g2(self) -> Outcome:
        """The lookup finds the payment a key made, and nothing for a key never sent."""
        if self.lookup_fn is None:
            return _FAIL, (
                f"no lookup given: {_NO_RECONCILE}; a send whose answer was lost stays unknown "
                "and waits for an operator"
            )
        key = f"{self.prefix}:g2"
        made = self.payment_id(self._send(f"the send under {key!r}", self.amount, key))
        try:
            found = self.lookup_fn(key)
        except Exception as exc:
            return _FAIL, f"lookup({key!r}) raised {type(exc).__name__}: {exc}: {_NO_RECONCILE}"
        if found is None:
            return _FAIL, f"lookup({key!r}) found nothing for payment {made!r}: {_NO_RECONCILE}"
        if self.payment_id(found) != made:
            return _FAIL, (
                f"lookup({key!r}) found {self.payment_id(found)!r}, not payment {made!r} that the "
                f"key made: {_NO_RECONCILE}"
            )
        never = f"{self.prefix}:g2-never-sent"
        try:
            stray = self.lookup_fn(never)
        except Exception as exc:
            return _FAIL, (
                f"lookup({never!r}) of a key never sent raised {type(exc).__name__}: {exc}; "
                "it must answer None, or reconcile cannot tell 'not sent' from an error"
            )
        if stray is not None:
            return _FAIL, (
                f"lookup({never!r}) of a key never sent found {self.payment_id(stray)!r}: "
                "reconcile would settle a payment that never happened"
            )
        return _PASS, f"lookup({key!r}) found payment {made!r}; a key never sent found nothing"

    def g3(self) -> Outcome:
        """A repeat just inside the required retention is still the same payment."""
        if self.clock is None:
            return _SKIP, (
                "no clock given, so the key's retention was not probed; check that the gateway "
                f"documents keeping keys at least {self.retention:g} s"
            )
        key = f"{self.prefix}:g3"
        first = self._send(f"the first send under {key!r}", self.amount, key)
        later = max(self.retention - min(1.0, self.retention / 2), 0.0)
        self.clock.advance(later)
        second = self._send(f"the repeat {later:g} s later under {key!r}", self.amount, key)
        a, b = self.payment_id(first), self.payment_id(second)
        if a == b:
            return _PASS, f"a repeat {later:g} s after the first send answered payment {a!r}"
        return _FAIL, (
            f"a repeat {later:g} s after the first send answered another payment ({a!r}, then "
            f"{b!r}): the key was not kept {self.retention:g} s, so a late replay charges again"
        )

    def g4(self) -> Outcome:
        """A repeat answers the first response itself."""
        key, first, second = self._twice("G4")
        if first == second:
            return _PASS, f"the repeat under {key!r} answered the first response unchanged"
        a, b = self.payment_id(first), self.payment_id(second)
        if a != b:
            return _FAIL, f"the repeat under {key!r} answered another payment ({a!r}, {b!r})"
        differ = ""
        if isinstance(first, Mapping) and isinstance(second, Mapping):
            names = sorted(
                str(k) for k in set(first) | set(second) if first.get(k) != second.get(k)
            )
            differ = f" (fields that differ: {', '.join(names)})"
        return _FAIL, (
            f"the repeat under {key!r} answered payment {a!r} but not its first response{differ}: "
            "a repeat cannot be told from a new charge"
        )

    def g5(self) -> Outcome:
        """The same key with another amount is refused."""
        key = f"{self.prefix}:g5"
        first = self._send(f"the first send under {key!r}", self.amount, key)
        other = self.amount * 2
        try:
            second = self.send_fn(other, key)
        except AnotherRequestsAnswerError as exc:
            return _FAIL, (
                f"amount {other} under {key!r} (first sent with {self.amount}) was answered "
                f"with the first payment again; the adapter refused to take it ({exc}), "
                "the gateway did not"
            )
        except Exception as exc:
            return _PASS, (
                f"amount {other} under {key!r} (first sent with {self.amount}) was refused: "
                f"{type(exc).__name__}: {exc}"
            )
        a, b = self.payment_id(first), self.payment_id(second)
        what = "the first payment: the change went unnoticed" if a == b else "a second payment"
        return _FAIL, (
            f"amount {other} under {key!r} (first sent with {self.amount}) was accepted and "
            f"answered {b!r}, {what}; only celery_agboss's own fingerprint check catches it"
        )

    def own(self) -> Outcome:
        """A payment made under a key is never taken for a request of another amount
        under that key: reconcile answers Unknown, or finds nothing to compare and the
        resend it allows is refused."""
        assert self.reconcile_fn is not None
        key = f"{self.prefix}:own"
        made = self.payment_id(self._send(f"the send under {key!r}", self.amount, key))
        other = self.amount * 2
        try:
            answer = self.reconcile_fn(other, key)
        except Exception as exc:
            return _FAIL, (
                f"reconcile of a request of {other} under {key!r} raised "
                f"{type(exc).__name__}: {exc}"
            )
        if isinstance(answer, Unknown):
            return _PASS, (
                f"reconcile of a request of {other} under {key!r}, where payment {made!r} of "
                f"{self.amount} was made, answered Unknown: {answer.reason}"
            )
        if isinstance(answer, Completed):
            return _FAIL, (
                f"reconcile took payment {self.payment_id(answer.result)!r} (made with "
                f"{self.amount}) for a request of {other} under {key!r}: an order would be "
                "marked paid with another order's payment; reconcile must compare the amount "
                "and currency with the request's and answer Unknown when they differ"
            )
        if not isinstance(answer, NotSent):
            return _FAIL, f"reconcile answered {answer!r}, not Completed, NotSent or Unknown"
        try:
            resent = self.send_fn(other, key)
        except Exception as exc:
            return _PASS, (
                f"reconcile found nothing to compare under {key!r}; the resend of {other} it "
                f"allows was refused: {type(exc).__name__}: {exc}"
            )
        return _FAIL, (
            f"reconcile answered NotSent under {key!r}, where payment {made!r} of "
            f"{self.amount} was made, and the resend of {other} was answered "
            f"{self.payment_id(resent)!r}: taken for the request's own"
        )

    def reconcile(self) -> Outcome:
        """Reconcile answers what the gateway shows about the request's own key: never a
        payment for a key never sent, and the key's payment when the gateway shows it."""
        never = f"{self.prefix}:reconcile-never-sent"
        phantom = self._ask_reconcile(never)
        if isinstance(phantom, Completed):
            return _FAIL, (
                f"reconcile answered Completed (payment {self.payment_id(phantom.result)!r}) "
                f"for {never!r}, a key never sent: an order would be marked paid with no money "
                "taken; reconcile must answer NotSent (or Unknown) when the gateway shows "
                "nothing under the key"
            )
        key = f"{self.prefix}:reconcile"
        made = self.payment_id(self._send(f"the send under {key!r}", self.amount, key))
        answer = self._ask_reconcile(key)
        if isinstance(answer, Completed):
            found = self.payment_id(answer.result)
            if found != made:
                return _FAIL, (
                    f"reconcile under {key!r} answered Completed with payment {found!r}, not "
                    f"payment {made!r} that the key made: the order would carry another "
                    "payment's receipt; reconcile must answer the key's own payment"
                )
            status, evidence = _PASS, f"answered Completed with payment {made!r} that it made"
        elif isinstance(answer, NotSent):
            status, evidence = self._after_not_sent(key, made)
        else:
            status, evidence = self._after_unknown(key, made, answer)
        return status, (
            f"reconcile of {never!r} (never sent) answered {type(phantom).__name__}; "
            f"under {key!r} it {evidence}"
        )

    def _ask_reconcile(self, key: str) -> Completed[Any] | NotSent | Unknown:
        assert self.reconcile_fn is not None
        try:
            answer = self.reconcile_fn(self.amount, key)
        except Exception as exc:
            raise _ProbeError(f"reconcile({self.amount}, {key!r})", exc) from exc
        if not isinstance(answer, (Completed, NotSent, Unknown)):
            raise _ProbeError(
                f"reconcile({self.amount}, {key!r})",
                TypeError(f"answered {answer!r}, not Completed, NotSent or Unknown"),
            )
        return answer

    def _shown(self, key: str) -> Any:
        """The id of the payment the lookup shows under ``key``; None when there is no
        lookup, it raised, or it found nothing (then only a resend can tell)."""
        if self.lookup_fn is None:
            return None
        try:
            found = self.lookup_fn(key)
        except Exception:
            return None
        return None if found is None else self.payment_id(found)

    def _after_not_sent(self, key: str, made: Any) -> Outcome:
        """NotSent about a payment that exists is safe only as a replay-only gateway's
        answer: nothing can look it up, and the resend under the key answers it again."""
        if self._shown(key) == made:
            return _FAIL, (
                f"answered NotSent, where payment {made!r} was made a moment ago and "
                f"lookup({key!r}) finds it: after a lost answer the payment is sent again, a "
                "second charge once the gateway no longer replays the key (past its retention; "
                "at any age with lookup_proves_absence), and a cancel settles the paid order as "
                "never paid; reconcile must answer Completed(the payment) when the gateway "
                "shows one under the key, and NotSent only when it shows none"
            )
        try:
            resent = self.payment_id(self.send_fn(self.amount, key))
        except Exception as exc:
            return _FAIL, (
                f"answered NotSent, where payment {made!r} was made, and the resend under the "
                f"key raised {type(exc).__name__}: {exc}: the paid order would be handed an "
                "error; reconcile must answer Completed(the payment), or Unknown"
            )
        if resent != made:
            return _FAIL, (
                f"answered NotSent, where payment {made!r} was made, and the resend under the "
                f"key made payment {resent!r}: a second charge; reconcile must answer "
                "Completed(the payment), or Unknown when it cannot tell"
            )
        return _PASS, (
            f"answered NotSent; no lookup shows payment {made!r}, and the resend under the key "
            "answered it again (the gateway's replay): safe only inside the key's retention, so "
            "declare the call's key_retention no longer than the gateway's"
        )

    def _after_unknown(self, key: str, made: Any, answer: Unknown) -> Outcome:
        """Unknown moves nothing twice; about a payment the lookup shows it is only costly."""
        if self._shown(key) == made:
            return _WARN, (
                f"answered Unknown ({answer.reason}) though lookup({key!r}) finds payment "
                f"{made!r}: no money moves twice, but every lost answer waits for an operator "
                "(agboss resolve); reconcile should answer Completed(the payment) when the "
                "gateway shows it"
            )
        return _PASS, (
            f"answered Unknown ({answer.reason}); no lookup shows payment {made!r}, so an "
            "operator decides each lost answer (design: G2)"
        )
