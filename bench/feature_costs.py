"""What an optional feature adds to one execution: each feature on against all off, in one run.

The engine benchmark's execution (``bench.engine_bench``: lease, one outbound call, one
fenced effect, release) on SQLite, in interleaved blocks: everything off (as without
``opentelemetry-api`` and ``agboss_encryption_keys``); tracing on (the SDK's tracer
provider recording every span into an exporter that keeps nothing, so the cost is making
the spans and events, not shipping them); records sealed at rest (every request, result
and history detail sealed and opened with AES-GCM). Each ratio is on ÷ off for the same
work.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.databases import sqlite_database
from bench.engine_bench import BLOCK, _Sides
from bench.stats import LatencySample, fmt, fmt_ratio, ratio, table


@dataclass(frozen=True)
class FeatureSizes:
    executions: int
    warmup: int


QUICK_FEATURE_SIZES = FeatureSizes(executions=100, warmup=10)
DEFAULT_FEATURE_SIZES = FeatureSizes(executions=600, warmup=30)


SIDES = ("off", "tracing", "sealed")


@dataclass(frozen=True)
class FeatureCosts:
    off: LatencySample
    tracing: LatencySample
    sealed: LatencySample

    def lines(self) -> list[str]:
        named = (("all off", self.off), ("tracing on", self.tracing), ("sealed", self.sealed))
        rows = [
            [name, fmt(sample.per_second), fmt(sample.p50_ms, 3), fmt(sample.p95_ms, 3)]
            for name, sample in named
        ]
        return [
            "Features (engine execution on SQLite, one thread, interleaved): "
            f"{self.off.count} executions per side",
            table(["side", "exec/s", "p50 ms", "p95 ms"], rows),
            f"ratio: tracing on/off  p50 {fmt_ratio(self.tracing_ratio())}"
            f"  (+{fmt(self.tracing.p50_ms - self.off.p50_ms, 3)} ms per execution)",
            f"ratio: sealed/off  p50 {fmt_ratio(self.encryption_ratio())}"
            f"  (+{fmt(self.sealed.p50_ms - self.off.p50_ms, 3)} ms per execution)",
        ]

    def tracing_ratio(self) -> float:
        return ratio(self.tracing.p50_ms, self.off.p50_ms)

    def encryption_ratio(self) -> float:
        return ratio(self.sealed.p50_ms, self.off.p50_ms)

    def metrics(self) -> dict[str, float]:
        return {
            "tracing_on_to_off_p50_ratio": self.tracing_ratio(),
            "encryption_on_to_off_p50_ratio": self.encryption_ratio(),
        }


@contextmanager
def _side(name: str, provider: Any, store: Any, sealer: Any) -> Iterator[None]:
    """Tracing or sealing switched on for a block; everything off after it."""
    from celery_agboss.core import tracing
    from celery_agboss.core.sealing import PLAINTEXT

    tracing.use_tracer_provider(provider if name == "tracing" else None)
    if name == "sealed":
        store.sealer = sealer
    try:
        yield
    finally:
        tracing.use_tracer_provider(None)
        store.sealer = PLAINTEXT


def _recording_provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Discard()))
    return provider


def run_feature_benchmark(
    folder: Path, sizes: FeatureSizes, progress: Callable[[str], None]
) -> FeatureCosts:
    from celery_agboss.core import tracing
    from celery_agboss.core.sealing import KeyRing, Sealer

    if not tracing.install():
        raise RuntimeError("the tracing cost needs opentelemetry-api and -sdk (make venv)")
    provider = _recording_provider()
    sealer = Sealer(KeyRing([("bench", os.urandom(32))]), store_sealed=True)
    progress(f"features: all off, tracing, sealed; {sizes.executions} executions each")
    with sqlite_database(folder) as url:
        sides = _Sides(url)
        try:
            samples: dict[str, list[float]] = {name: [] for name in SIDES}
            number = 0
            for name in SIDES:
                with _side(name, provider, sides.store, sealer):
                    for _ in range(sizes.warmup):
                        sides.agboss(number)
                        number += 1
            while len(samples[SIDES[-1]]) < sizes.executions:
                for name in SIDES:
                    with _side(name, provider, sides.store, sealer):
                        for _ in range(BLOCK):
                            start = time.perf_counter()
                            sides.agboss(number)
                            samples[name].append(time.perf_counter() - start)
                            number += 1
        finally:
            sides.close()
    return FeatureCosts(*(LatencySample(tuple(samples[name])) for name in SIDES))


__all__ = [
    "DEFAULT_FEATURE_SIZES",
    "QUICK_FEATURE_SIZES",
    "FeatureCosts",
    "run_feature_benchmark",
]
