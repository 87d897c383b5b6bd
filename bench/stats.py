"""Numbers and how they are printed: latency samples, percentiles, ratios, plain tables.

Every comparison is a ratio of celery_agboss over plain work measured in the same
run, on the same machine, so a busy or slow machine moves both sides together.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` in 0..1) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class LatencySample:
    """Per-execution latencies (seconds) of one side; throughput counts only their sum,
    so time spent between executions (bookkeeping of the benchmark) is left out."""

    latencies: tuple[float, ...]

    @property
    def count(self) -> int:
        return len(self.latencies)

    @property
    def busy_seconds(self) -> float:
        return sum(self.latencies)

    @property
    def per_second(self) -> float:
        busy = self.busy_seconds
        return self.count / busy if busy > 0 else math.nan

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies, 0.50) * 1000

    @property
    def p95_ms(self) -> float:
        return percentile(self.latencies, 0.95) * 1000


def ratio(numerator: float, denominator: float) -> float:
    if denominator == 0 or math.isnan(denominator) or math.isnan(numerator):
        return math.nan
    return numerator / denominator


def fmt(value: float, digits: int = 1) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def fmt_ratio(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], left: Collection[int] = (0,)
) -> str:
    """A plain-text table: the ``left`` columns (the first) left-aligned, numbers right."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(widths[i]) if i in left else cell.rjust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


__all__ = ["LatencySample", "fmt", "fmt_ratio", "percentile", "ratio", "table"]
