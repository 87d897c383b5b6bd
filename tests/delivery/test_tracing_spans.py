"""Spans and span events of deliveries, exported to the OpenTelemetry SDK's in-memory
exporter (design: tracing).

An outbound call is a CLIENT span ``agboss.outbound <call>`` with its outcome and attempt,
a fenced effect a span ``agboss.fenced_effect <name>``, and what the engine logs while a
span records is an event of that span. A declined call ends its span ``failed`` with its
error's type, never its text. Every exported attribute, of every span and event, is
scanned for the idempotency keys, the business key, the request's fields and the
decline's text; the twin exports every field of the events (the switch
``trace-attributes-unfiltered``) and the scan finds a key.

The worker runs in the test's process (threads), so the spans have no Celery parent here;
tests/integration/test_tracing.py has them under Celery's ``run/<task>`` span.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from celery_agboss.core import tracing
from celery_agboss.core.protections import TRACE_ATTRIBUTES_UNFILTERED
from celery_agboss.testing import sabotage
from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.delivery.conftest import PaymentShop

CARD = "4242424242424242"
REQUEST = {"amount": 1234, "order": "o-secret-1", "card": CARD}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing.use_tracer_provider(provider)
    try:
        yield exported
    finally:
        tracing.use_tracer_provider(trace.get_tracer_provider())  # the global one again


def _checkout(shop: PaymentShop) -> Any:
    charge, fee = shop.call("shop.charge"), shop.call("shop.fee")

    @shop.task()
    def checkout(self: Any) -> Any:
        receipt = self.outbound(charge, REQUEST, business_key="order:o-secret-1")
        again = self.outbound(charge, REQUEST, business_key="order:o-secret-1")
        self.outbound(fee, {**REQUEST, "amount": 30})  # keyed by its position: a step key
        self.fenced_effect("mark-paid", lambda conn: {"paid": receipt["id"]})
        return again["id"]

    return checkout


def _every_value(spans: tuple[ReadableSpan, ...]) -> list[str]:
    values = []
    for span in spans:
        values.extend(str(v) for v in (span.attributes or {}).values())
        for event in span.events:
            values.append(event.name)
            values.extend(str(v) for v in (event.attributes or {}).values())
    return values


def _secrets(shop: PaymentShop, execution_id: str) -> list[str]:
    keys = [intent.idempotency_key for intent in shop.intents(execution_id)]
    return [*keys, "order:o-secret-1", "o-secret-1", CARD]


def _named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def test_calls_and_effects_are_spans_with_their_outcomes_and_events(
    shop: PaymentShop, exporter: InMemorySpanExporter
) -> None:
    task_id = shop.run(_checkout(shop), states=("COMPLETED",))
    spans = exporter.get_finished_spans()
    sent, replayed = _named(spans, "agboss.outbound shop.charge")
    assert sent.kind is SpanKind.CLIENT
    assert dict(sent.attributes or {}) == {
        "agboss.call": "shop.charge",
        "agboss.execution_id": task_id,
        "agboss.attempt": 1,
        "agboss.outcome": "sent",
    }
    assert "outbound-call.sent" in [event.name for event in sent.events]
    assert (replayed.attributes or {})["agboss.outcome"] == "replayed"
    (effect,) = _named(spans, "agboss.fenced_effect mark-paid")
    assert (effect.attributes or {})["agboss.outcome"] == "applied"
    assert "fenced-effect.applied" in [event.name for event in effect.events]
    leaked = [v for v in _every_value(spans) for s in _secrets(shop, task_id) if s in v]
    assert leaked == []


def test_a_declined_call_ends_its_span_failed_with_a_type_and_no_text(
    shop: PaymentShop, exporter: InMemorySpanExporter
) -> None:
    charge = shop.call("shop.charge")

    @shop.task()
    def declined(self: Any) -> Any:
        return self.outbound(charge, REQUEST, business_key="order:o-secret-1")

    shop.gateway.inject_fault(FakeGatewayFault.DECLINE)
    task_id = shop.run(declined, states=("FAILED",))
    assert len(shop.gateway.requests) == 1
    # A delivery handed back after the decline (its verdict's transaction cut short on a
    # starved machine) replays the stored decline: one more span, ended the same way.
    spans = _named(exporter.get_finished_spans(), "agboss.outbound shop.charge")
    assert spans
    for span in spans:
        assert (span.attributes or {})["agboss.outcome"] == "failed"
        assert (span.attributes or {})["error.type"] == "FakeGatewayError"
        assert span.status.status_code is StatusCode.ERROR and not span.status.description
        assert "exception" not in [event.name for event in span.events]
    values = _every_value(exporter.get_finished_spans())
    assert not [v for v in values if "DECLINED" in v or "fake gateway" in v]
    assert not [v for v in values for s in _secrets(shop, task_id) if s in v]


def test_spans_with_every_field_of_the_events_export_a_key(
    shop: PaymentShop, exporter: InMemorySpanExporter
) -> None:
    """The twin: without the allow-list, the step-keyed call's key is exported."""
    with sabotage(TRACE_ATTRIBUTES_UNFILTERED):
        task_id = shop.run(_checkout(shop), states=("COMPLETED",))
    values = _every_value(exporter.get_finished_spans())
    assert [v for v in values for s in _secrets(shop, task_id) if s in v]
