"""Every metric celery_agboss exposes, and which log event moves which counter.

The counters are driven by the structured log events (``core.log_events``): each
decision is logged once, so counting the events counts the decisions, in whichever
process made them. ``observations(event, fields, names)`` is the whole mapping, pure
(no ``prometheus_client``), so a unit test can hold every event against it.

Label values come only from closed sets: the event names, fixed outcome words, the
sweepers' ``by``, and task and call names this process has registered. Anything else
(an unregistered name, a value that is not a str) is ``other``: a business key, an
amount or an execution id can never become a label, whatever a field carries.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from celery_agboss.core.log_events import (
    EXECUTION_DEFERRED,
    EXECUTION_FENCED,
    EXECUTION_REPLAYED,
    EXECUTION_UNMANAGED,
    FENCED_EFFECT_REPLAYED,
    LOG_EVENTS,
    OUTBOUND_CALL_FAILED,
    OUTBOUND_CALL_FAILURE_REPLAYED,
    OUTBOUND_CALL_JOINED,
    OUTBOUND_CALL_LOOKUP_FAILED,
    OUTBOUND_CALL_NOT_SENT_CONFIRMED,
    OUTBOUND_CALL_OUTCOME_UNKNOWN,
    OUTBOUND_CALL_RECONCILED,
    OUTBOUND_CALL_REPLAYED,
    OUTBOUND_CALL_SENT,
    OUTBOUND_CALL_SUPERSEDED,
    OUTBOUND_CALL_UNRECONCILED,
    SWEEP_ERROR,
    SWEEP_FINISHED,
    SWEEP_SKIPPED,
)
from celery_agboss.sweep.runner import BY_WORKER
from celery_agboss.sweep.steps import SweepReport

OTHER = "other"
"""The label value of anything outside a label's closed set."""

COUNTER = "counter"
HISTOGRAM = "histogram"
GAUGE = "gauge"


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its name (a counter's samples add ``_total``), kind, labels, help."""

    name: str
    kind: str
    labels: tuple[str, ...]
    help: str


# --- counted from the log events, in every process (multiprocess mode) ----------------
EVENTS = MetricSpec(
    "agboss_events", COUNTER, ("event",), "Structured log events of celery_agboss, by name."
)
EXECUTION_REPLAYS = MetricSpec(
    "agboss_execution_replays",
    COUNTER,
    ("task",),
    "Deliveries of a finished execution that replayed its stored outcome (no body run).",
)
OUTBOUND_CALL_REPLAYS = MetricSpec(
    "agboss_outbound_call_replays",
    COUNTER,
    ("call", "outcome"),
    "Outbound calls answered from the store instead of the gateway (completed or failed).",
)
FENCED_EFFECT_REPLAYS = MetricSpec(
    "agboss_fenced_effect_replays",
    COUNTER,
    (),
    "Fenced effects whose recorded result was returned instead of running them again.",
)
RECONCILIATIONS = MetricSpec(
    "agboss_reconciliations",
    COUNTER,
    ("call", "outcome"),
    "Lookups of an intent of unknown outcome, by what they found (found, not_sent, "
    "unreconciled, lookup_failed); by deliveries and by the sweep.",
)
FENCED_REFUSALS = MetricSpec(
    "agboss_fenced_refusals",
    COUNTER,
    ("task",),
    "Deliveries refused by the fence: their lease was taken over, nothing they did after "
    "is trusted.",
)
SUPERSEDED_CALLS = MetricSpec(
    "agboss_outbound_calls_superseded",
    COUNTER,
    ("call",),
    "Outbound-call attempts another holder took over (nothing stored by the loser).",
)
DEFERRED_DUPLICATES = MetricSpec(
    "agboss_deferred_duplicates",
    COUNTER,
    ("task",),
    "Deliveries deferred because a live delivery of the same execution holds its lease.",
)
OUTBOUND_CALLS = MetricSpec(
    "agboss_outbound_calls",
    COUNTER,
    ("call", "outcome"),
    "Outbound-call attempts by outcome (sent, failed, unknown, joined).",
)
UNMANAGED_EXECUTIONS = MetricSpec(
    "agboss_unmanaged_executions",
    COUNTER,
    ("task",),
    "Recorded executions whose message ran as a task that is not a PaymentTask (a plain "
    "task matching agboss_payment_tasks, an old worker of a rolling deploy): UNMANAGED.",
)
SWEEPS = MetricSpec(
    "agboss_sweeps",
    COUNTER,
    ("by", "result"),
    "Sweep runs by who ran them and whether they ran (finished) or found the tick taken (skipped).",
)
SWEEP_DURATION = MetricSpec(
    "agboss_sweep_duration_seconds",
    HISTOGRAM,
    ("by",),
    "How long each finished sweep run took.",
)
SWEEP_ROWS = MetricSpec(
    "agboss_sweep_rows",
    COUNTER,
    ("by", "action"),
    "What sweep runs did, row by row (republished, reconciled, parked, expired…).",
)
SWEEP_ERRORS = MetricSpec(
    "agboss_sweep_errors", COUNTER, ("step",), "Sweep steps that failed (left for the next run)."
)

EVENT_METRICS = (
    EVENTS,
    EXECUTION_REPLAYS,
    OUTBOUND_CALL_REPLAYS,
    FENCED_EFFECT_REPLAYS,
    RECONCILIATIONS,
    FENCED_REFUSALS,
    SUPERSEDED_CALLS,
    DEFERRED_DUPLICATES,
    OUTBOUND_CALLS,
    UNMANAGED_EXECUTIONS,
    SWEEPS,
    SWEEP_DURATION,
    SWEEP_ROWS,
    SWEEP_ERRORS,
)

SWEEP_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

# --- read from the store at scrape time, by the process that serves the endpoint ------
STORE_UP = MetricSpec(
    "agboss_store_up", GAUGE, (), "1 when the store answered this scrape, else 0."
)
PENDING_INTENTS = MetricSpec(
    "agboss_pending_intents",
    GAUGE,
    (),
    "Outbound calls that may have reached the gateway and are not settled (agboss pending).",
)
INTENTS_NEEDING_OPERATOR = MetricSpec(
    "agboss_intents_needing_operator",
    GAUGE,
    (),
    "Of the pending intents, those only an operator can settle (agboss resolve).",
)
EXECUTIONS = MetricSpec(
    "agboss_executions",
    GAUGE,
    ("state",),
    "Executions in each state that is not terminal (PARKED, WAITING_OPERATOR…); other: in "
    "a state a newer version of celery_agboss wrote.",
)
EXECUTIONS_FAILED_AFTER_PAYMENT = MetricSpec(
    "agboss_executions_failed_after_payment",
    GAUGE,
    (),
    "FAILED or CANCELLED executions that left a completed payment behind, not yet marked "
    "handled (agboss pending, agboss payments-handled).",
)
SECONDS_SINCE_LAST_SWEEP = MetricSpec(
    "agboss_seconds_since_last_sweep",
    GAUGE,
    (),
    "Seconds since a sweep of beat (or --loop, or an operator) last finished, on the "
    "database clock; +Inf when none ever did.",
)

STORE_METRICS = (
    STORE_UP,
    PENDING_INTENTS,
    INTENTS_NEEDING_OPERATOR,
    EXECUTIONS,
    EXECUTIONS_FAILED_AFTER_PAYMENT,
    SECONDS_SINCE_LAST_SWEEP,
)

METRICS = (*EVENT_METRICS, *STORE_METRICS)
"""Every metric, as docs/metrics.md lists them."""


@dataclass(frozen=True)
class Observation:
    """One change to one metric: add ``value`` (a histogram: observe it)."""

    metric: MetricSpec
    labels: tuple[str, ...]
    value: float = 1.0


@dataclass(frozen=True)
class KnownNames:
    """Which task and call names may be label values: the ones this process registered.

    ``tasks`` and ``calls`` list those registered so far, so that their series can be
    made at 0 before any event (``known_series``); a name registered later still
    passes ``is_task``/``is_call`` and its series starts at its first event.
    """

    is_task: Callable[[str], bool]
    is_call: Callable[[str], bool]
    tasks: Callable[[], Iterable[str]] = tuple
    calls: Callable[[], Iterable[str]] = tuple


SWEEPERS = frozenset({"beat", "loop", "operator", BY_WORKER})
"""``by`` of ``run_sweep``: who ran a sweep."""

SWEEP_ACTIONS = tuple(
    f.name
    for f in dataclasses.fields(SweepReport)
    if f.type in (int, "int") and f.name not in ("tick", "duration_ms", "errors")
)
"""The counts of a ``SweepReport`` (``errors`` is ``agboss_sweep_errors`` by step)."""

_STEP = re.compile(r"[a-z][a-z_-]{0,31}")

# event -> (metric, labels): "task" and "call" read that field, "=word" is the word.
_SIMPLE: dict[str, tuple[MetricSpec, tuple[str, ...]]] = {
    EXECUTION_REPLAYED: (EXECUTION_REPLAYS, ("task",)),
    OUTBOUND_CALL_REPLAYED: (OUTBOUND_CALL_REPLAYS, ("call", "=completed")),
    OUTBOUND_CALL_FAILURE_REPLAYED: (OUTBOUND_CALL_REPLAYS, ("call", "=failed")),
    FENCED_EFFECT_REPLAYED: (FENCED_EFFECT_REPLAYS, ()),
    OUTBOUND_CALL_RECONCILED: (RECONCILIATIONS, ("call", "=found")),
    OUTBOUND_CALL_NOT_SENT_CONFIRMED: (RECONCILIATIONS, ("call", "=not_sent")),
    OUTBOUND_CALL_UNRECONCILED: (RECONCILIATIONS, ("call", "=unreconciled")),
    OUTBOUND_CALL_LOOKUP_FAILED: (RECONCILIATIONS, ("call", "=lookup_failed")),
    EXECUTION_FENCED: (FENCED_REFUSALS, ("task",)),
    OUTBOUND_CALL_SUPERSEDED: (SUPERSEDED_CALLS, ("call",)),
    EXECUTION_DEFERRED: (DEFERRED_DUPLICATES, ("task",)),
    OUTBOUND_CALL_SENT: (OUTBOUND_CALLS, ("call", "=sent")),
    OUTBOUND_CALL_FAILED: (OUTBOUND_CALLS, ("call", "=failed")),
    OUTBOUND_CALL_OUTCOME_UNKNOWN: (OUTBOUND_CALLS, ("call", "=unknown")),
    OUTBOUND_CALL_JOINED: (OUTBOUND_CALLS, ("call", "=joined")),
    EXECUTION_UNMANAGED: (UNMANAGED_EXECUTIONS, ("task",)),
}


def _known(value: Any, accept: Callable[[str], bool]) -> str:
    if not isinstance(value, str) or not value:
        return OTHER
    try:
        return value if accept(value) else OTHER
    except Exception:  # a registry that cannot answer gives no label, never an error
        return OTHER


def _label(token: str, fields: Mapping[str, Any], names: KnownNames) -> str:
    if token.startswith("="):
        return token[1:]
    if token == "task":
        return _known(fields.get("task"), names.is_task)
    return _known(fields.get("call"), names.is_call)


def _sweeper(fields: Mapping[str, Any]) -> str:
    return _known(fields.get("by"), SWEEPERS.__contains__)


def _sweep(event: str, fields: Mapping[str, Any]) -> list[Observation]:
    if event == SWEEP_SKIPPED:
        return [Observation(SWEEPS, (_sweeper(fields), "skipped"))]
    if event == SWEEP_ERROR:
        step = _known(fields.get("step"), lambda value: _STEP.fullmatch(value) is not None)
        return [Observation(SWEEP_ERRORS, (step,))]
    by = _sweeper(fields)
    found = [Observation(SWEEPS, (by, "finished"))]
    duration_ms = fields.get("duration_ms", 0)
    if isinstance(duration_ms, (int, float)) and not isinstance(duration_ms, bool):
        found.append(Observation(SWEEP_DURATION, (by,), max(0.0, duration_ms / 1000)))
    for action in SWEEP_ACTIONS:
        count = fields.get(action)
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            found.append(Observation(SWEEP_ROWS, (by, action), float(count)))
    return found


def known_series(names: KnownNames) -> list[tuple[MetricSpec, tuple[str, ...]]]:
    """Every labelled series an event of ``_SIMPLE`` can move, for the names known now
    and ``other``: made at 0 up front, so that an alert's ``increase()`` sees the first
    event as 0 to 1 (a series born at 1 is no increase to Prometheus)."""
    named = {
        "task": [*_listed(names.tasks, names.is_task), OTHER],
        "call": [*_listed(names.calls, names.is_call), OTHER],
    }
    found: dict[tuple[str, tuple[str, ...]], tuple[MetricSpec, tuple[str, ...]]] = {}
    for metric, tokens in _SIMPLE.values():
        if not tokens:
            continue  # a metric without labels is exposed at 0 from the start
        choices = [[t[1:]] if t.startswith("=") else named[t] for t in tokens]
        for labels in itertools.product(*choices):
            found.setdefault((metric.name, labels), (metric, labels))
    return list(found.values())


def _listed(listing: Callable[[], Iterable[str]], accept: Callable[[str], bool]) -> list[str]:
    """The names ``listing`` gives that ``accept`` takes, sorted; none when it cannot
    answer (never an error at start-up)."""
    try:
        return sorted({name for name in listing() if _known(name, accept) != OTHER})
    except Exception:
        return []


def observations(event: str, fields: Mapping[str, Any], names: KnownNames) -> list[Observation]:
    """What one log event changes: ``agboss_events`` always, and its own counter."""
    found = [Observation(EVENTS, (event if event in LOG_EVENTS else OTHER,))]
    simple = _SIMPLE.get(event)
    if simple is not None:
        metric, tokens = simple
        found.append(Observation(metric, tuple(_label(t, fields, names) for t in tokens)))
    elif event in (SWEEP_FINISHED, SWEEP_SKIPPED, SWEEP_ERROR):
        found.extend(_sweep(event, fields))
    return found


__all__ = [
    "EVENT_METRICS",
    "METRICS",
    "OTHER",
    "STORE_METRICS",
    "SWEEP_ACTIONS",
    "SWEEP_DURATION_BUCKETS",
    "KnownNames",
    "MetricSpec",
    "known_series",
    "observations",
]
