"""The integration shop, traced as docs/tracing.md tells users to set it up.

Each worker process (the pool's children included) gets the OpenTelemetry SDK's tracer
provider and Celery's instrumentation in ``worker_process_init``; its finished spans go
to a JSON-lines file the test names in ``config["span_file"]`` (an exporter that
appends, so the spans of a child killed later are already on disk).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from celery import Celery
from celery.signals import worker_process_init

from tests.integration.apps import shop
from tests.integration.apps.shop import app_from_environment

CONFIG_ENV = "AGBOSS_TRACED_CONFIG"


def make_app(config: dict[str, Any]) -> Celery:
    app = shop.make_app(config)
    span_file = config.get("span_file")
    if span_file:

        @worker_process_init.connect(weak=False)
        def trace_this_process(**_: Any) -> None:
            _set_up_tracing(str(span_file))

    return app


def _set_up_tracing(span_file: str) -> None:
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class AppendingExporter(SpanExporter):
        """Each finished span as one JSON line, written at once."""

        lock = threading.Lock()

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            lines = [json.dumps({**json.loads(s.to_json()), "pid": os.getpid()}) for s in spans]
            with self.lock, open(span_file, "a", encoding="utf-8") as out:
                out.write("".join(f"{line}\n" for line in lines))
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(AppendingExporter()))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()


app = app_from_environment(CONFIG_ENV, make_app)
