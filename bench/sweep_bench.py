"""The sweep-cost benchmark: one sweep pass over a little and over a lot of history.

The sweep must cost what the stranded work costs, not what history holds (issue 11,
goal 3). Two throwaway databases hold 10K and 1M terminal executions written
straight into the tables (``bench.sweep_rows``), both at once. Then, in rounds that
alternate between them (so a busy machine slows both alike), each gets one sweep pass
over history alone (``idle``: every listing must come back empty without reading
history), then 100 stranded executions (``RUNNING`` with an expired lease, half with a
``PENDING`` intent no live lease owns) and one timed pass that reconciles the intents
(a lookup that finds the payment) and re-drives the executions onto an in-memory
broker. The ratio of the median timed passes, large over small, is the number to read.

Every statement of the timed pass at the larger size is then shown with its plan
(PostgreSQL: ``EXPLAIN (ANALYZE, BUFFERS)`` in a transaction rolled back, over a fresh
set of stranded rows; SQLite: ``EXPLAIN QUERY PLAN``), and each full scan of a table
that grows with history is counted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from bench import databases
from bench.stats import fmt, table
from bench.sweep_world import QueryPlan, SweptDatabase, swept_database

Progress = Callable[[str], None]

SMALL_TABLES = frozenset({"agboss_meta", "agboss_clock", "agboss_alembic_version", "CONSTANT"})
"""What a full scan of never grows with history: the sweep's ticks and ``last_sweep_at``
(about a dozen rows), the one-row clock subquery, the store's one-row revision (read once
a pass before retention) and SQLite's ``CONSTANT ROW``."""


@dataclass(frozen=True)
class SweepSizes:
    small: int
    large: int
    stranded: int = 100
    rounds: int = 3


DEFAULT_SWEEP_SIZES = SweepSizes(10_000, 1_000_000)
QUICK_SWEEP_SIZES = SweepSizes(1_000, 20_000, rounds=2)


@dataclass(frozen=True)
class SizeRun:
    """One database: its history, and the passes timed over it (one per round)."""

    terminal: int
    stranded: int
    load_seconds: float
    idle_seconds: tuple[float, ...]
    sweep_seconds: tuple[float, ...]
    statements: int  # in the last timed pass

    @property
    def idle_median(self) -> float:
        return statistics.median(self.idle_seconds)

    @property
    def sweep_median(self) -> float:
        return statistics.median(self.sweep_seconds)


@dataclass(frozen=True)
class SweepResult:
    backend: str
    runs: tuple[SizeRun, ...]
    plans: tuple[QueryPlan, ...] = field(repr=False)

    def _ratio(self, of: Callable[[SizeRun], float]) -> float:
        small, large = of(self.runs[0]), of(self.runs[-1])
        return large / small if small else float("nan")

    @property
    def ratio(self) -> float:
        return self._ratio(lambda run: run.sweep_median)

    @property
    def idle_ratio(self) -> float:
        return self._ratio(lambda run: run.idle_median)

    @property
    def history_scans(self) -> list[tuple[str, QueryPlan]]:
        """Every (table, plan) where a table that grows with history is read whole."""
        return [
            (name, plan)
            for plan in self.plans
            for name in plan.full_scans
            if name not in SMALL_TABLES
        ]

    def lines(self) -> list[str]:
        def ms(values: tuple[float, ...]) -> str:
            return " ".join(fmt(v * 1000, 0) for v in values)

        rows = [
            [
                f"{run.terminal:,} + {run.stranded}",
                fmt(run.load_seconds, 1),
                fmt(run.idle_median * 1000, 1),
                fmt(run.sweep_median * 1000, 1),
                ms(run.sweep_seconds),
                str(run.statements),
            ]
            for run in self.runs
        ]
        headers = ["terminal + stranded", "load s", "idle ms", "sweep ms", "each pass ms"]
        scans = sorted({name for name, _ in self.history_scans})
        return [
            f"Sweep cost on {self.backend}: one pass over terminal history + stranded executions"
            " (rows written directly);",
            "idle: a pass over history alone; sweep: the pass that reconciles and re-drives"
            f" the stranded ones (medians of {len(self.runs[0].sweep_seconds)} alternating"
            " rounds)",
            table([*headers, "SQL/pass"], rows),
            f"ratio: sweep {self.backend:<11} largest/smallest {self.ratio:.2f}x"
            f"  (idle pass {self.idle_ratio:.2f}x); {len(self.plans)} distinct statements,"
            f" full scans of history tables: {', '.join(scans) or 'none'}",
            "",
        ]

    def metrics(self) -> dict[str, float]:
        prefix = "sweep" if self.backend == "postgresql" else f"sweep_{self.backend}"
        small, large = self.runs[0], self.runs[-1]
        return {
            f"{prefix}_ratio": round(self.ratio, 3),
            f"{prefix}_idle_ratio": round(self.idle_ratio, 3),
            f"{prefix}_small_ms": round(small.sweep_median * 1000, 1),
            f"{prefix}_large_ms": round(large.sweep_median * 1000, 1),
            f"{prefix}_history_scans": float(len(self.history_scans)),
        }

    def plans_text(self) -> str:
        """Every statement of the timed pass at the largest size, with its plan."""
        out: list[str] = []
        for number, plan in enumerate(self.plans, 1):
            out += [f"-- [{number}] {plan.statement}", f"-- parameters: {plan.parameters}"]
            out += [plan.plan, ""]
        return "\n".join(out)


def _run(backend: str, urls: Iterator[str], sizes: SweepSizes, progress: Progress) -> SweepResult:
    with ExitStack() as stack:
        loaded: list[SweptDatabase] = []
        for terminal in (sizes.small, sizes.large):
            url = next(urls)
            db = stack.enter_context(swept_database(url, backend, terminal, sizes.stranded))
            progress(f"  {terminal:,} terminal executions loaded in {db.load_seconds:.1f} s")
            loaded.append(db)
        for number in range(sizes.rounds):
            for db in loaded:
                db.round(f"r{number}-")
                progress(
                    f"  round {number + 1}, {db.terminal:,} + {sizes.stranded}: idle "
                    f"{db.idle_seconds[-1] * 1000:.0f} ms, sweep "
                    f"{db.sweep_seconds[-1] * 1000:.0f} ms ({db.statements} statements)"
                )
        plans = loaded[-1].plans("explain-")
        runs = tuple(
            SizeRun(
                db.terminal,
                db.stranded,
                db.load_seconds,
                tuple(db.idle_seconds),
                tuple(db.sweep_seconds),
                db.statements,
            )
            for db in loaded
        )
    return SweepResult(backend, runs, tuple(plans))


def run_sweep_benchmark(
    admin_url: str, sizes: SweepSizes = DEFAULT_SWEEP_SIZES, progress: Progress = print
) -> SweepResult:
    """The sweep-cost benchmark on PostgreSQL (two throwaway databases, dropped after)."""
    progress(
        f"sweep benchmark on postgresql: {sizes.small:,} and {sizes.large:,} + {sizes.stranded}"
    )
    with ExitStack() as stack:

        def urls() -> Iterator[str]:
            while True:
                yield stack.enter_context(databases.postgres_database(admin_url))

        return _run("postgresql", urls(), sizes, progress)


def run_sqlite_sweep_benchmark(
    folder: Path, sizes: SweepSizes = DEFAULT_SWEEP_SIZES, progress: Progress = print
) -> SweepResult:
    """The same on SQLite (a file per size in ``folder``, removed after)."""
    progress(f"sweep benchmark on sqlite: {sizes.small:,} and {sizes.large:,} + {sizes.stranded}")
    with ExitStack() as stack:

        def urls() -> Iterator[str]:
            while True:
                yield stack.enter_context(databases.sqlite_database(folder))

        return _run("sqlite", urls(), sizes, progress)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sweep_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1K and 20K terminal executions")
    parser.add_argument("--small", type=int, help="terminal executions of the small database")
    parser.add_argument("--large", type=int, help="terminal executions of the large database")
    parser.add_argument("--rounds", type=int, help="timed passes per size")
    parser.add_argument("--sqlite", action="store_true", help="also on SQLite (slow to load)")
    parser.add_argument("--plans", type=Path, help="write every statement's plan here")
    args = parser.parse_args(argv)
    base = QUICK_SWEEP_SIZES if args.quick else DEFAULT_SWEEP_SIZES
    sizes = SweepSizes(
        args.small or base.small,
        args.large or base.large,
        base.stranded,
        args.rounds or base.rounds,
    )

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    results = [run_sweep_benchmark(databases.postgres_admin_url(), sizes, progress)]
    if args.sqlite:
        with tempfile.TemporaryDirectory(prefix="agboss-sweep-bench-") as folder:
            results.append(run_sqlite_sweep_benchmark(Path(folder), sizes, progress))
    for result in results:
        print("\n".join(result.lines()))
    for result in results:
        for name, value in result.metrics().items():
            print(f"{name}={value:g}")
    if args.plans is not None:
        args.plans.write_text("\n\n".join(r.plans_text() for r in results), encoding="utf-8")
    return 0


__all__ = [
    "DEFAULT_SWEEP_SIZES",
    "QUICK_SWEEP_SIZES",
    "QueryPlan",
    "SizeRun",
    "SweepResult",
    "SweepSizes",
    "run_sqlite_sweep_benchmark",
    "run_sweep_benchmark",
]

if __name__ == "__main__":
    raise SystemExit(main())
