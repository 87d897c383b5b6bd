"""More benchmarks for ``make bench``: each returns its table lines and its metrics.

A benchmark added here runs after the engine and end-to-end ones (not with
``--engine-only`` or ``--e2e-only``); its lines are printed as they are and its
metrics join the ``name=value`` lines at the end (``bench.report``), checked against
their goal when ``bench.report.GOALS`` has one. Adding one takes two lines, e.g.::

    from bench.sweep_bench import QUICK_SWEEP_SIZES, DEFAULT_SWEEP_SIZES, run_sweep_benchmark
    EXTRA_BENCHMARKS.append(ExtraBenchmark("sweep", lambda ctx: lines_and_metrics(
        run_sweep_benchmark(ctx.admin_url,
                            QUICK_SWEEP_SIZES if ctx.quick else DEFAULT_SWEEP_SIZES,
                            ctx.progress))))

A benchmark that raises is reported as FAILED (exit status 1) and the others still run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ExtraOutcome = tuple[list[str], dict[str, float]]
"""Table lines to print, and metrics (``name`` → value) for the ``name=value`` lines."""


@dataclass(frozen=True)
class BenchContext:
    """What an extra benchmark may use; it makes (and removes) its own resources."""

    quick: bool
    folder: Path
    """A temporary folder of this run, removed at its end."""
    admin_url: str
    """PostgreSQL, a role that may create databases (``bench.databases``)."""
    redis_url: str
    """The Redis server (database 0: lease a database with ``bench.redis_db``)."""
    progress: Callable[[str], None]


@dataclass(frozen=True)
class ExtraBenchmark:
    name: str
    run: Callable[[BenchContext], ExtraOutcome]
    needs_postgresql: bool = True
    """Skipped with a note when PostgreSQL cannot be reached."""


def lines_and_metrics(result: Any) -> ExtraOutcome:
    """Adapt a result with ``lines()`` (or ``rows()``) and ``metrics()`` methods."""
    lines = result.lines() if hasattr(result, "lines") else result.rows()
    metrics: Mapping[str, Any] = result.metrics()
    return [str(line) for line in lines], {k: float(v) for k, v in metrics.items()}


def _hot_path(ctx: BenchContext) -> ExtraOutcome:
    from bench.databases import postgres_database
    from bench.hot_path import DEFAULT_HOT_PATH_SIZES, QUICK_HOT_PATH_SIZES, run_hot_path_benchmark

    sizes = QUICK_HOT_PATH_SIZES if ctx.quick else DEFAULT_HOT_PATH_SIZES
    with postgres_database(ctx.admin_url) as url:
        return lines_and_metrics(run_hot_path_benchmark(url, ctx.folder, sizes, ctx.progress))


def _sweep(ctx: BenchContext) -> ExtraOutcome:
    from bench.sweep_bench import DEFAULT_SWEEP_SIZES, QUICK_SWEEP_SIZES, run_sweep_benchmark

    sizes = QUICK_SWEEP_SIZES if ctx.quick else DEFAULT_SWEEP_SIZES
    return lines_and_metrics(run_sweep_benchmark(ctx.admin_url, sizes, ctx.progress))


def _renewals(ctx: BenchContext) -> ExtraOutcome:
    from bench.renewal_bench import (
        DEFAULT_RENEWAL_SIZES,
        QUICK_RENEWAL_SIZES,
        run_renewal_benchmark,
    )

    sizes = QUICK_RENEWAL_SIZES if ctx.quick else DEFAULT_RENEWAL_SIZES
    result = run_renewal_benchmark(ctx.admin_url, ctx.redis_url, sizes, ctx.progress)
    return lines_and_metrics(result)


def _features(ctx: BenchContext) -> ExtraOutcome:
    from bench.feature_costs import (
        DEFAULT_FEATURE_SIZES,
        QUICK_FEATURE_SIZES,
        run_feature_benchmark,
    )

    sizes = QUICK_FEATURE_SIZES if ctx.quick else DEFAULT_FEATURE_SIZES
    return lines_and_metrics(run_feature_benchmark(ctx.folder, sizes, ctx.progress))


EXTRA_BENCHMARKS: list[ExtraBenchmark] = [
    ExtraBenchmark("hot-path", _hot_path),
    ExtraBenchmark("sweep", _sweep),
    ExtraBenchmark("renewal", _renewals),
    ExtraBenchmark("features", _features, needs_postgresql=False),
]
"""Run in this order by ``bench/run.py``."""


__all__ = [
    "EXTRA_BENCHMARKS",
    "BenchContext",
    "ExtraBenchmark",
    "ExtraOutcome",
    "lines_and_metrics",
]
