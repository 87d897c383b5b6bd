"""Tracing on a real worker, set up as docs/tracing.md says: the OpenTelemetry SDK and
``opentelemetry-instrumentation-celery`` in each worker process.

The worker running a charge is SIGKILLed, its pool child included, while the gateway
holds the charge's answer; a new worker gets the message back and its delivery
reconciles the charge (no sweep runs: the test apps have none). Its spans show it:
under that delivery's ``run/it.charge_order`` span, an ``agboss.outbound it.charge``
span (kind CLIENT) whose outcome is ``reconciled``, with the ``outbound-call.reconciled``
event, on the same trace.
No exported attribute, of any span or event, holds the idempotency key, the business
key, the request's fields or an exception's text (design: tracing).

Harness speed-ups as in tests/integration/harness.py (``-Q``, a 5 s lease, a 6 s
visibility timeout); spans go to
a file (``tests/integration/apps/traced_app.py``), as the SDK's exporters would send them
to a collector.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.apps import traced_app
from tests.integration.gateway_http import wait_for
from tests.integration.harness import ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis]

VISIBILITY_SECONDS = 6
"""Past the 5 s lease: the message comes back to the new worker after the lease expired."""


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _every_attribute(span: dict[str, Any]) -> list[Any]:
    values = list((span.get("attributes") or {}).values())
    for event in span.get("events") or []:
        values.append(event.get("name"))
        values.extend((event.get("attributes") or {}).values())
    return values


def test_a_killed_charge_s_next_delivery_shows_reconciled_under_its_run_span(
    shop_factory: ShopFactory, tmp_path: Path
) -> None:
    span_file = tmp_path / "spans.jsonl"
    shop = shop_factory(
        app_module=traced_app, span_file=str(span_file), visibility_timeout=VISIBILITY_SECONDS
    )
    order = "o-traced-1"
    first = shop.start_worker()
    hold = shop.gateway.gateway.hold(operation="charge")  # processed; its answer held
    task_id = shop.publish("it.charge_order", order)
    try:
        hold.wait_reached(timeout=20)
        first.kill()  # the whole worker: no sweep runs here, so the next delivery reconciles
    finally:
        hold.release()
    shop.start_worker()  # Redis gives the message back once its visibility timeout passed
    shop.wait_state(task_id, "COMPLETED", timeout=60)
    assert len(shop.gateway.gateway.payments) == 1
    assert len(shop.gateway.gateway.requests) == 1, "reconciled by a lookup, never sent again"

    def reconciled_span() -> dict[str, Any] | None:
        for span in _spans(span_file):
            attributes = span.get("attributes") or {}
            if (
                span["name"] == "agboss.outbound it.charge"
                and attributes.get("agboss.execution_id") == task_id
                and attributes.get("agboss.outcome") == "reconciled"
            ):
                return span
        return None

    def parent_of(span: dict[str, Any]) -> list[dict[str, Any]]:
        return [s for s in _spans(span_file) if s["context"]["span_id"] == span["parent_id"]]

    # A span is written when it ends: the call's before the delivery's run span around it.
    wait_for(
        lambda: (found := reconciled_span()) is not None and parent_of(found) != [],
        20,
        "the reconciled call's span and its parent",
    )
    call = reconciled_span()
    assert call is not None
    assert call["kind"] == "SpanKind.CLIENT"
    assert "outbound-call.reconciled" in [e["name"] for e in call["events"]]
    spans = _spans(span_file)
    (run,) = parent_of(call)
    assert run["name"] == "run/it.charge_order", "inside Celery's own span for the delivery"
    assert run["context"]["trace_id"] == call["context"]["trace_id"]
    assert (run.get("attributes") or {}).get("celery.task_name") == "it.charge_order"

    (intent,) = shop.intents_of(task_id)
    secrets = [intent.idempotency_key, f"order:{order}", order]
    for span in spans:
        for value in _every_attribute(span):
            for secret in secrets:
                assert secret not in str(value), f"{span['name']} exports {value!r}"
