"""Spans and span events through OpenTelemetry, when ``opentelemetry-api`` is installed.

An outbound call is a span ``agboss.outbound <call>`` (kind CLIENT) and a fenced effect a
span ``agboss.fenced_effect <name>``, each inside whatever span is current (the
``run/<task>`` span of ``opentelemetry-instrumentation-celery`` in a worker). Every
structured log event (``core.log_events``) that happens while a span records becomes a
span event of that span: intent transitions, reconciles, fence refusals, take-overs,
undos. The decisions are made and named once, where they are logged; this module only
observes them (design: tracing).

Attributes carry names, handles, ids, counts and error types only, from an allow-list:
never an idempotency key (it holds the business key), a request, a result, a payload or
an exception's text.

Nothing is imported until the app installs tracing (``install``, from ``AGBoss``); without
the package that is one failed import, once, and every call after it checks one global.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from celery_agboss.core import sabotage
from celery_agboss.core.log_events import (
    FENCED_EFFECT_APPLIED,
    FENCED_EFFECT_REPLAYED,
    add_event_observer,
)
from celery_agboss.core.protections import TRACE_ATTRIBUTES_UNFILTERED
from celery_agboss.errors import (
    ExecutionFencedError,
    OutboundCallCompensatedError,
    OutboundCallInFlightError,
    OutboundCallOutcomeUnknownError,
    OutboundCallUnreconciledError,
)

T = TypeVar("T")

TRACER_NAME = "celery_agboss"
ATTRIBUTE_PREFIX = "agboss."

SPAN_FIELDS = frozenset(
    {
        "call",
        "effect",
        "execution_id",
        "attempt",
        "business_key_handle",
        "holder",
        "token",
        "state",
        "recovery_count",
        "deliveries",
        "undo",
        "step",
        "tick",
        "decision",
    }
)
"""The event fields a span event may carry (as ``agboss.<field>``). ``error``, when it
is a type's name, is carried as ``agboss.error_type``; nothing else is."""

_TYPE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,99}$")

_OUTCOMES: tuple[tuple[type[BaseException], str], ...] = (
    (ExecutionFencedError, "fenced"),
    (OutboundCallOutcomeUnknownError, "unknown"),
    (OutboundCallInFlightError, "in_flight"),
    (OutboundCallUnreconciledError, "unreconciled"),
    (OutboundCallCompensatedError, "compensated"),
)

_EFFECT_OUTCOMES = {FENCED_EFFECT_APPLIED: "applied", FENCED_EFFECT_REPLAYED: "replayed"}

_trace: Any = None  # the ``opentelemetry.trace`` module, once installed
_tracer: Any = None
_install_lock = threading.Lock()
_tried = False
_ours = threading.local()  # the innermost span this module opened, on this thread


def install() -> bool:
    """Turn tracing on if ``opentelemetry-api`` can be imported; whether it is on. Tried
    once per process: a process without the package pays one failed import."""
    global _trace, _tracer, _tried
    with _install_lock:
        if not _tried:
            _tried = True
            try:
                from opentelemetry import trace
            except ImportError:
                return False
            _trace = trace
            _tracer = trace.get_tracer(TRACER_NAME)
            add_event_observer(_span_event, listens=_span_records)
        return _tracer is not None


def installed() -> bool:
    return _tracer is not None


def use_tracer_provider(provider: Any) -> None:
    """Make spans with ``provider`` instead of the global one (``trace.set_tracer_provider``
    is what most deployments use; this is for a provider of one's own, e.g. in a test or
    a benchmark). ``None``: no spans in this process, as without the package."""
    global _tracer
    if provider is None:
        _tracer = None
        return
    if _trace is None and not install():
        raise ImportError("tracing needs opentelemetry-api: pip install 'celery-agboss[otel]'")
    _tracer = provider.get_tracer(TRACER_NAME)


def outcome_of(exc: BaseException) -> str:
    """The outcome a call that raised ``exc`` ends with: a signal names its own, any
    other error is ``failed``."""
    for kind, outcome in _OUTCOMES:
        if isinstance(exc, kind):
            return outcome
    return "failed"


def traced_outbound(
    call: str, execution_id: str, run: Callable[[], tuple[T, Any]]
) -> tuple[T, Any]:
    """``run()`` (an outbound call: its result and ``Outcome``) inside its span."""
    if _tracer is None:
        return run()
    attributes = {"agboss.call": call, "agboss.execution_id": execution_id}
    with _our_span(f"agboss.outbound {call}", attributes, client=True) as span:
        try:
            result, outcome = run()
        except BaseException as exc:
            _ended_by(span, exc)
            raise
        span.set_attribute("agboss.outcome", str(outcome.value).lower())
        return result, outcome


def traced_effect(name: str, execution_id: str, run: Callable[[], T]) -> T:
    """``run()`` (a fenced effect) inside its span; its outcome is what it logs."""
    if _tracer is None:
        return run()
    attributes = {"agboss.effect": name, "agboss.execution_id": execution_id}
    with _our_span(f"agboss.fenced_effect {name}", attributes, client=False) as span:
        try:
            return run()
        except BaseException as exc:
            _ended_by(span, exc)
            raise


@contextmanager
def _our_span(name: str, attributes: Mapping[str, Any], *, client: bool) -> Iterator[Any]:
    """A span of this module, current while the block runs, remembered as ours."""
    kind = _trace.SpanKind.CLIENT if client else _trace.SpanKind.INTERNAL
    with _tracer.start_as_current_span(
        name,
        kind=kind,
        attributes=dict(attributes),
        record_exception=False,  # its text could hold a card number or an amount
        set_status_on_exception=False,
    ) as span:
        outer = getattr(_ours, "span", None)
        _ours.span = span
        try:
            yield span
        finally:
            _ours.span = outer


def _ended_by(span: Any, exc: BaseException) -> None:
    outcome = outcome_of(exc)
    span.set_attribute("agboss.outcome", outcome)
    span.set_attribute("error.type", type(exc).__name__)
    if outcome == "failed":
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR))  # no description: it would be the text


def span_attributes(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes an event's fields give a span event: the allow-listed ones."""
    attributes: dict[str, Any] = {}
    if sabotage.active(TRACE_ATTRIBUTES_UNFILTERED):
        return {ATTRIBUTE_PREFIX + name: str(value) for name, value in fields.items()}
    for name, value in fields.items():
        if value is None or isinstance(value, list):
            continue
        if name in SPAN_FIELDS:
            attributes[ATTRIBUTE_PREFIX + name] = value
        elif name in ("error", "error_type") and isinstance(value, str) and _TYPE_NAME.match(value):
            attributes[ATTRIBUTE_PREFIX + "error_type"] = value
    return attributes


def _span_records() -> bool:
    """Whether an event now would reach a span: asked before the event is built."""
    return bool(_trace.get_current_span().is_recording())


def _is_ours(span: Any) -> bool:
    return getattr(_ours, "span", None) is span


def _span_event(event: str, fields: Mapping[str, Any]) -> None:
    """An event observer: the event on the current span, when one records."""
    span: Any = _trace.get_current_span()
    if not span.is_recording():
        return
    attributes = span_attributes(fields)
    span.add_event(event, attributes=attributes)
    if not _is_ours(span):
        return  # the run span, or a user's: it gets the event, its attributes stay theirs
    if "agboss.attempt" in attributes:
        span.set_attribute("agboss.attempt", attributes["agboss.attempt"])
    if event in _EFFECT_OUTCOMES:
        span.set_attribute("agboss.outcome", _EFFECT_OUTCOMES[event])


__all__ = ["install", "traced_effect", "traced_outbound", "use_tracer_provider"]
