"""What happened to each order, counted where the money is.

Three witnesses, read after the shop went quiet: the gateway's own records (payments
per order reference, declines, refunds), the shop's orders table, and the store's
execution rows. A placed order is

- **paid twice**: two payments or more at the gateway (whatever else says);
- **lost** when its one payment is not the order's: another amount or currency than
  the shop's (``amount_of``, ``CURRENCY``), or not captured in full (status other than
  ``succeeded``, ``amount_captured`` other than the amount) — whatever the execution's
  state, so a wrong payment is never taken for one a person will decide on;
- **waiting for an operator**: its execution visibly waits (WAITING_OPERATOR, PARKED)
  with no payment or the order's own — a person decides, nothing is lost;
- **paid once**: that one payment, the order marked paid with it, its execution
  COMPLETED;
- **declined**: no payment, a decline at the gateway, the order marked declined;
- **lost** otherwise: charged but not marked, marked with a payment the gateway never
  made, FAILED while paid, or still unsettled when the bound ran out.

Money is wrong (``ok`` false) with any order paid twice or lost, any phantom refund
(the shop never refunds, so every refund at the gateway is one) or any payment for
no order of the run (a customer charged for nothing). Separately, a run is
``complete`` only when every requested order was placed, and at least one: an order
whose every publish was refused is not placed and never judged, so a verdict
without it would say nothing about it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_agboss.chaos.shop import CURRENCY, amount_of, declined
from celery_agboss.core.executions import OPERATOR_WAIT_STATES

WAITING_STATES = frozenset(state.value for state in OPERATOR_WAIT_STATES)

PAID_ONCE = "paid once"
DECLINED = "declined"
WAITING = "waiting for an operator"
PAID_TWICE = "paid twice"
LOST = "lost"


@dataclass(frozen=True)
class OrderOutcome:
    order: int
    task_id: str
    verdict: str
    state: str
    payments: int
    detail: str = ""


@dataclass(frozen=True)
class Execution:
    state: str
    reason: str | None


def _not_the_orders(order: int, payment: dict[str, Any]) -> str | None:
    """Why ``payment`` is not the one the order asked for (amount, currency, captured in
    full), or None: money moved wrongly whatever the execution says."""
    amount, currency = payment.get("amount"), payment.get("currency")
    status, captured = payment.get("status"), payment.get("amount_captured")
    expected = amount_of(order)
    if amount == expected and currency == CURRENCY:
        if status == "succeeded" and captured == expected:
            return None
        return f"{payment['id']} is {status} with {captured} of {amount} captured"
    return f"charged {amount} {currency} ({payment['id']}), expected {expected} {CURRENCY}"


def classify(
    order: int,
    task_id: str,
    payments: list[dict[str, Any]],
    declines: int,
    row: tuple[str, str | None] | None,
    execution: Execution | None,
) -> OrderOutcome:
    """One order's verdict from its three witnesses."""
    state = "not recorded" if execution is None else execution.state
    count = len(payments)

    def outcome(verdict: str, detail: str = "") -> OrderOutcome:
        return OrderOutcome(order, task_id, verdict, state, count, detail)

    if count >= 2:
        attempts = [p.get("metadata", {}).get("attempt") for p in payments]
        return outcome(PAID_TWICE, f"payments {[p['id'] for p in payments]}, attempts {attempts}")
    wrong = _not_the_orders(order, payments[0]) if count == 1 else None
    if wrong is not None:  # before the state: a parked wrong charge is not "waiting"
        return outcome(LOST, wrong)
    if state in WAITING_STATES:
        reason = "" if execution is None else (execution.reason or "")
        return outcome(WAITING, reason)
    if state != "COMPLETED":
        charged = "charged, " if count else ""
        return outcome(LOST, f"{charged}execution {state} (not settled, not visibly waiting)")
    if count == 1:
        payment = payments[0]["id"]
        if row == ("paid", payment):
            return outcome(PAID_ONCE)
        return outcome(LOST, f"charged {payment}, but the shop's row is {row}")
    if declines and row == ("declined", None) and declined(order):
        return outcome(DECLINED)
    return outcome(LOST, f"COMPLETED with no payment; the shop's row is {row}")


def settled(outcome: OrderOutcome) -> bool:
    """Whether nothing more will happen to this order by itself."""
    return outcome.verdict in (PAID_ONCE, DECLINED, WAITING, PAID_TWICE)


@dataclass
class Verdict:
    seed: int
    orders: list[OrderOutcome]
    phantom_refunds: int
    faults: Mapping[str, int]
    skipped_faults: Mapping[str, int]
    duration_seconds: float
    gateway: Mapping[str, int]
    settings: Mapping[str, Any]
    stray_payments: int  # payments at the gateway whose reference is no order of the run
    not_placed: int  # orders given up on: every publish refused until the bound
    orders_requested: int
    notes: list[str] = field(default_factory=list)

    def of(self, verdict: str) -> list[OrderOutcome]:
        return [o for o in self.orders if o.verdict == verdict]

    @property
    def counts(self) -> dict[str, int]:
        counted = Counter(o.verdict for o in self.orders)
        return {
            key: counted.get(key, 0) for key in (PAID_ONCE, DECLINED, WAITING, PAID_TWICE, LOST)
        }

    @property
    def ok(self) -> bool:
        """The money is right: nobody charged twice, for a lost order, or for nothing."""
        counts = self.counts
        return (
            counts[PAID_TWICE] == 0
            and counts[LOST] == 0
            and self.phantom_refunds == 0
            and self.stray_payments == 0
        )

    @property
    def complete(self) -> bool:
        """Every requested order was placed (and one at least): the verdict covers the run,
        not only the orders a refused publish happened to spare."""
        placed = len(self.orders)
        return self.not_placed == 0 and placed == self.orders_requested and placed > 0

    @property
    def headline(self) -> str:
        """MONEY WRONG before INCOMPLETE: a wrong payment is wrong however few orders ran."""
        return "MONEY WRONG" if not self.ok else "INCOMPLETE" if not self.complete else "OK"

    def as_json(self) -> dict[str, Any]:
        counts = self.counts
        return {
            "ok": self.ok,
            "complete": self.complete,
            "seed": self.seed,
            "orders": len(self.orders),
            "orders_requested": self.orders_requested,
            "not_placed": self.not_placed,
            "paid_once": counts[PAID_ONCE],
            "declined": counts[DECLINED],
            "waiting_for_operator": counts[WAITING],
            "paid_twice": counts[PAID_TWICE],
            "lost": counts[LOST],
            "phantom_refunds": self.phantom_refunds,
            "stray_payments": self.stray_payments,
            "faults": dict(self.faults),
            "skipped_faults": dict(self.skipped_faults),
            "duration_seconds": round(self.duration_seconds, 1),
            "gateway": dict(self.gateway),
            "settings": dict(self.settings),
            "problems": [
                {
                    "order": o.order,
                    "task_id": o.task_id,
                    "verdict": o.verdict,
                    "state": o.state,
                    "payments": o.payments,
                    "detail": o.detail,
                }
                for o in self.orders
                if o.verdict in (WAITING, PAID_TWICE, LOST)
            ],
        }

    def render(self, inspect: str) -> str:
        """The verdict table; ``inspect`` is the command prefix that shows one execution."""
        counts = self.counts
        rows = [
            (PAID_ONCE, counts[PAID_ONCE], ""),
            (DECLINED, counts[DECLINED], ""),
            (WAITING, counts[WAITING], "listed below" if counts[WAITING] else ""),
            (PAID_TWICE, counts[PAID_TWICE], "must be 0"),
            (LOST, counts[LOST], "must be 0"),
            ("phantom refunds", self.phantom_refunds, "must be 0"),
            ("payments for no order", self.stray_payments, "must be 0"),
            ("not placed", self.not_placed, "not judged" if self.not_placed else ""),
        ]
        width = max(len(r[0]) for r in rows)
        placed, requested = len(self.orders), self.orders_requested
        counted = f"{placed} orders"
        if placed != requested:
            counted = f"{placed} of {requested} orders placed"
        lines = [
            f"chaos verdict: {self.headline} "
            f"(seed {self.seed}, {counted}, {self.duration_seconds:.0f} s)",
        ]
        if not self.complete:
            covers = f"covers those {placed} only" if placed else "covers no order at all"
            lines.append(
                f"  {placed} of {requested} orders were placed ({self.not_placed} not placed: "
                f"every publish refused until the bound); this verdict {covers}"
            )
        lines.append("")
        for label, value, note in rows:
            flag = "  <-- " + note if note == "must be 0" and value else f"  {note}" if note else ""
            lines.append(f"  {label:<{width}}  {value:>5}{flag}")
        lines.append("")
        injected = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        lines.append(f"faults injected ({sum(self.faults.values())}): {injected}")
        if self.skipped_faults:
            skipped = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped_faults.items()))
            lines.append(f"faults skipped (nothing to hit in time): {skipped}")
        lines.append("gateway: " + ", ".join(f"{k} {v}" for k, v in self.gateway.items()))
        lines.append("settings: " + ", ".join(f"{k}={v}" for k, v in self.settings.items()))
        for title, verdict in ((WAITING, WAITING), (PAID_TWICE, PAID_TWICE), (LOST, LOST)):
            listed = self.of(verdict)
            if not listed:
                continue
            lines.append("")
            lines.append(f"{title}:")
            for o in listed:
                lines.append(
                    f"  order {o.order}: task {o.task_id}, {o.state}, {o.payments} payment(s)"
                    + (f"; {o.detail}" if o.detail else "")
                )
            lines.append(f"  inspect one: {inspect} <task id>")
        lines.extend(self.notes)
        return "\n".join(lines)


def summarise(
    orders: Mapping[int, str],
    payments: Iterable[dict[str, Any]],
    declines: Iterable[str | None],
    rows: Mapping[str, tuple[str, str | None]],
    executions: Mapping[str, Execution],
) -> list[OrderOutcome]:
    """Every order's outcome; ``payments`` and ``declines`` carry the order reference."""
    by_reference: dict[str, list[dict[str, Any]]] = {}
    for payment in payments:
        by_reference.setdefault(str(payment.get("reference")), []).append(payment)
    declined_refs = Counter(str(ref) for ref in declines)
    out = []
    for order, task_id in sorted(orders.items()):
        reference = f"order:{order}"
        out.append(
            classify(
                order,
                task_id,
                by_reference.get(reference, []),
                declined_refs.get(reference, 0),
                rows.get(str(order)),
                executions.get(task_id),
            )
        )
    return out


__all__ = [
    "LOST",
    "PAID_ONCE",
    "PAID_TWICE",
    "WAITING",
    "Execution",
    "OrderOutcome",
    "Verdict",
    "classify",
    "settled",
    "summarise",
]
