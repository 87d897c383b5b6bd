"""The command line of ``bench/run.py``: choose sizes, run the benchmarks, print the results.

Each benchmark makes its own throwaway resources (SQLite file, PostgreSQL database,
Redis database, worker processes) and removes them on the way out, also when it
fails or the run is interrupted (SIGINT, SIGTERM). A service that cannot be reached
is skipped with a message; a benchmark that fails is reported and makes the exit
status 1, after the others ran. Sizes are bounded by time budgets as well as by
counts, so a slow machine makes a shorter run that says so, not a longer one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import sqlite3
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

from bench import databases, e2e_report, redis_db
from bench.e2e_bench import E2ESizes, E2EWorld, Setting, run_e2e_benchmark
from bench.engine_bench import EngineSizes, run_engine_benchmark
from bench.extras import EXTRA_BENCHMARKS, BenchContext
from bench.report import Report, render

BACKENDS = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Sizes:
    engine: EngineSizes
    e2e: E2ESizes


DEFAULT_SIZES = Sizes(
    EngineSizes(300, 10, 30.0),
    E2ESizes((Setting(0.0, 2000, 2, 45.0), Setting(50.0, 300, 2, 20.0))),
)
QUICK_SIZES = Sizes(
    EngineSizes(25, 3, 30.0),
    E2ESizes((Setting(0.0, 40, 1, 20.0), Setting(50.0, 10, 1, 10.0)), drain_seconds=60.0),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/run.py",
        description="celery_agboss against plain Celery, measured in one run (docs/benchmarks.md).",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--engine-only", action="store_true", help="only the engine benchmark")
    only.add_argument("--e2e-only", action="store_true", help="only the end-to-end benchmark")
    only.add_argument(
        "--extras-only",
        metavar="NAMES",
        help="only these extra benchmarks, comma-separated: "
        + ", ".join(extra.name for extra in EXTRA_BENCHMARKS),
    )
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="store backends of the engine benchmark (default: sqlite,postgresql)",
    )
    parser.add_argument(
        "--e2e-backend",
        choices=("auto", *BACKENDS),
        default="auto",
        help="store of the end-to-end benchmark (auto: postgresql if reachable, else sqlite)",
    )
    parser.add_argument("--executions", type=int, help="engine executions per side")
    parser.add_argument("--tasks", type=int, help="end-to-end tasks per round at 0 ms")
    parser.add_argument("--latency-tasks", type=int, help="end-to-end tasks per round at 50 ms")
    parser.add_argument("--rounds", type=int, help="end-to-end rounds per side and latency")
    parser.add_argument(
        "--round-seconds", type=float, help="time budget of each end-to-end round (publishing)"
    )
    parser.add_argument("--redis-db", type=int, default=14, help="Redis database to lease")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    args.backends = backends
    extras = [extra.name for extra in EXTRA_BENCHMARKS]
    args.extras = extras
    if args.extras_only is not None:
        args.extras = [n.strip() for n in args.extras_only.split(",") if n.strip()]
        wrong = sorted(set(args.extras) - set(extras))
        if wrong or not args.extras:
            parser.error(f"--extras-only: choose from {', '.join(extras)}")
    for name in ("executions", "tasks", "latency_tasks", "rounds"):
        value = getattr(args, name)
        if value is not None and not 1 <= value <= 100_000:
            parser.error(f"--{name.replace('_', '-')} must be between 1 and 100000")
    if args.round_seconds is not None and not 1 <= args.round_seconds <= 3600:
        parser.error("--round-seconds must be between 1 and 3600")
    if not 1 <= args.redis_db <= 15:
        parser.error("--redis-db must be between 1 and 15")
    return args


def _sizes(args: argparse.Namespace) -> Sizes:
    base = QUICK_SIZES if args.quick else DEFAULT_SIZES
    engine = base.engine
    if args.executions is not None:
        engine = EngineSizes(args.executions, engine.warmup, engine.budget_seconds)
    settings = []
    for setting in base.e2e.settings:
        tasks = args.tasks if setting.latency_ms == 0 else args.latency_tasks
        settings.append(
            replace(
                setting,
                tasks=tasks or setting.tasks,
                rounds=args.rounds or setting.rounds,
                round_budget_seconds=args.round_seconds or setting.round_budget_seconds,
            )
        )
    return Sizes(engine, replace(base.e2e, settings=tuple(settings)))


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds every ``finally``: workers and databases go


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _environment(report: Report) -> None:
    import celery
    import sqlalchemy

    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    report.environment.update(
        cores=str(os.cpu_count()),
        cpu=model,
        load_average_at_start=load,
        python=platform.python_version(),
        celery=celery.__version__,
        sqlalchemy=sqlalchemy.__version__,
        sqlite=sqlite3.sqlite_version,
    )


def _postgres(report: Report, purpose: str) -> str | None:
    """The admin URL when PostgreSQL can be reached, else None (and a note)."""
    admin = databases.postgres_admin_url()
    reason = databases.postgres_unreachable(admin)
    if reason is not None:
        report.notes.append(
            f"PostgreSQL skipped ({purpose}): cannot reach {_redact(admin)}: {reason}"
        )
        return None
    report.environment["postgresql"] = databases.postgres_version(admin)
    return admin


def _run_engine(args: argparse.Namespace, sizes: Sizes, folder: Path, report: Report) -> None:
    for backend in args.backends:
        _progress(f"engine benchmark on {backend} ({sizes.engine.executions} per side)")
        try:
            if backend == "sqlite":
                with databases.sqlite_database(folder) as url:
                    result = run_engine_benchmark(backend, url, sizes.engine)
            else:
                admin = _postgres(report, "engine")
                if admin is None:
                    continue
                with databases.postgres_database(admin) as url:
                    result = run_engine_benchmark(backend, url, sizes.engine)
        except Exception:
            report.failures.append(f"engine benchmark on {backend}:\n{traceback.format_exc()}")
            continue
        if result.cut_short:
            report.notes.append(
                f"engine on {backend}: time budget reached after {result.plain.count} per side"
            )
        report.engine.append(result)


def _run_e2e(args: argparse.Namespace, sizes: Sizes, folder: Path, report: Report) -> None:
    base = redis_db.redis_base_url()
    reason = redis_db.redis_unreachable(base)
    if reason is not None:
        report.notes.append(f"end-to-end skipped: cannot reach Redis at {base}: {reason}")
        return
    report.environment["redis"] = redis_db.redis_version(base)
    admin = None if args.e2e_backend == "sqlite" else _postgres(report, "end-to-end")
    if admin is None and args.e2e_backend == "postgresql":
        report.notes.append("end-to-end skipped: --e2e-backend postgresql is unreachable")
        return
    _progress(f"end-to-end benchmark on {'postgresql' if admin else 'sqlite'}")
    try:
        with redis_db.leased_database(base, args.redis_db) as redis_url:
            report.environment["redis_database"] = redis_url.rsplit("/", 1)[-1]
            store = (
                databases.sqlite_database(folder)
                if admin is None
                else databases.postgres_database(admin)
            )
            with store as url:
                world = E2EWorld(url, redis_url, folder, admin)
                report.e2e = run_e2e_benchmark(world, sizes.e2e, progress=_progress)
    except Exception:
        report.failures.append(f"end-to-end benchmark:\n{traceback.format_exc()}")
        return
    report.metrics.update(e2e_report.metrics(report.e2e))
    for setting in report.e2e.settings:
        cut = sum(1 for r in setting.rounds if r.timing.cut_short)
        if cut:
            report.notes.append(
                f"end-to-end at {setting.setting.latency_ms:g} ms: {cut} of "
                f"{len(setting.rounds)} rounds cut short by their "
                f"{setting.setting.round_budget_seconds:g} s budget (marked *)"
            )


def _run_extras(args: argparse.Namespace, folder: Path, report: Report) -> None:
    for extra in EXTRA_BENCHMARKS:
        if extra.name not in args.extras:
            continue
        admin = _postgres(report, extra.name) if extra.needs_postgresql else None
        if extra.needs_postgresql and admin is None:
            continue
        _progress(f"{extra.name} benchmark")
        context = BenchContext(
            quick=args.quick,
            folder=folder,
            admin_url=admin or databases.postgres_admin_url(),
            redis_url=redis_db.redis_base_url(),
            progress=_progress,
        )
        try:
            lines, metrics = extra.run(context)
        except Exception:
            report.failures.append(f"{extra.name} benchmark:\n{traceback.format_exc()}")
            continue
        report.extra_lines += [*lines, ""]
        report.metrics.update(metrics)


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _as_json(report: Report) -> dict[str, Any]:
    def clean(value: float) -> float | None:
        return None if math.isnan(value) else round(value, 4)

    return {
        "started": report.started.isoformat(),
        "environment": report.environment,
        "engine": [
            {
                "backend": r.backend,
                **{
                    side: {
                        "executions": s.count,
                        "per_second": clean(s.per_second),
                        "p50_ms": clean(s.p50_ms),
                        "p95_ms": clean(s.p95_ms),
                        "statements_per_execution": clean(sql.statements),
                        "commits_per_execution": clean(sql.transactions),
                    }
                    for side, s, sql in (
                        ("plain", r.plain, r.plain_sql),
                        ("agboss", r.agboss, r.agboss_sql),
                    )
                },
            }
            for r in report.engine
        ],
        "e2e": None if report.e2e is None else e2e_report.as_json(report.e2e),
        "metrics": {name: clean(value) for name, value in report.metrics.items()},
        "notes": report.notes,
        "failures": report.failures,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = _sizes(args)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    report = Report(started=datetime.now(timezone.utc))
    _environment(report)
    began = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="agboss-bench-") as tmp:
            folder = Path(tmp)
            everything = not (args.engine_only or args.e2e_only or args.extras_only)
            if everything or args.engine_only:
                _run_engine(args, sizes, folder, report)
            if everything or args.e2e_only:
                _run_e2e(args, sizes, folder, report)
            if everything or args.extras_only:
                _run_extras(args, folder, report)
    except (KeyboardInterrupt, SystemExit):
        _progress("interrupted: workers stopped, databases dropped, nothing printed")
        raise
    report.notes.append(f"whole run took {time.monotonic() - began:.0f} s")
    print(render(report), end="", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(_as_json(report), indent=2) + "\n", encoding="utf-8")
    return 1 if report.failures else 0


__all__ = ["main", "parse_args", "render"]
