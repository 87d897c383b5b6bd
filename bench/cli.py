"""The command line of ``bench/run.py``: choose sizes, run the benchmarks, print the ratios.

Each benchmark makes its own throwaway resources (SQLite file, PostgreSQL database,
Redis database, worker processes) and removes them on the way out, also when it
fails or the run is interrupted (SIGINT, SIGTERM). A service that cannot be reached
is skipped with a message; a benchmark that fails is reported and makes the exit
status 1, after the others ran.
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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

from bench import databases, redis_db
from bench.e2e_bench import E2ERun, E2ESizes, E2EWorld, RemoteGateway, run_e2e_benchmark
from bench.engine_bench import EngineResult, EngineSizes, run_engine_benchmark
from bench.stats import fmt, fmt_ratio, ratio, table

BACKENDS = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Sizes:
    engine: EngineSizes
    e2e: E2ESizes


DEFAULT_SIZES = Sizes(EngineSizes(500, 20, 90.0), E2ESizes(300, 150.0))
QUICK_SIZES = Sizes(EngineSizes(25, 3, 30.0), E2ESizes(20, 60.0))


@dataclass
class Report:
    started: datetime
    environment: dict[str, str] = field(default_factory=dict)
    engine: list[EngineResult] = field(default_factory=list)
    e2e: list[E2ERun] = field(default_factory=list)
    e2e_backend: str | None = None
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/run.py",
        description="celery_agboss against plain Celery: ratios measured in one run "
        "(docs/benchmarks.md).",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--engine-only", action="store_true", help="only the engine benchmark")
    only.add_argument("--e2e-only", action="store_true", help="only the end-to-end benchmark")
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
    parser.add_argument("--tasks", type=int, help="end-to-end tasks per side and pool")
    parser.add_argument("--redis-db", type=int, default=14, help="Redis database to lease")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    args.backends = backends
    for name in ("executions", "tasks"):
        value = getattr(args, name)
        if value is not None and not 1 <= value <= 100_000:
            parser.error(f"--{name} must be between 1 and 100000")
    if not 1 <= args.redis_db <= 15:
        parser.error("--redis-db must be between 1 and 15")
    return args


def _sizes(args: argparse.Namespace) -> Sizes:
    base = QUICK_SIZES if args.quick else DEFAULT_SIZES
    engine, e2e = base.engine, base.e2e
    if args.executions is not None:
        engine = EngineSizes(args.executions, engine.warmup, engine.budget_seconds)
    if args.tasks is not None:
        e2e = E2ESizes(args.tasks, max(e2e.budget_seconds, args.tasks * 1.0))
    return Sizes(engine, e2e)


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


def _run_engine(args: argparse.Namespace, sizes: Sizes, folder: Path, report: Report) -> None:
    for backend in args.backends:
        _progress(f"engine benchmark on {backend} ({sizes.engine.executions} per side)")
        try:
            if backend == "sqlite":
                with databases.sqlite_database(folder) as url:
                    result = run_engine_benchmark(backend, url, sizes.engine)
            else:
                admin = databases.postgres_admin_url()
                reason = databases.postgres_unreachable(admin)
                if reason is not None:
                    report.notes.append(
                        f"PostgreSQL skipped (engine): cannot reach {_redact(admin)}: {reason}"
                    )
                    continue
                report.environment["postgresql"] = databases.postgres_version(admin)
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
    backend = args.e2e_backend
    admin = databases.postgres_admin_url()
    if backend in ("auto", "postgresql"):
        unreachable = databases.postgres_unreachable(admin)
        if unreachable is None:
            backend = "postgresql"
            report.environment["postgresql"] = databases.postgres_version(admin)
        elif backend == "auto":
            report.notes.append(f"end-to-end on SQLite: PostgreSQL unreachable: {unreachable}")
            backend = "sqlite"
        else:
            report.notes.append(f"end-to-end skipped: PostgreSQL unreachable: {unreachable}")
            return
    report.e2e_backend = backend
    try:
        with (
            redis_db.leased_database(base, args.redis_db) as redis_url,
            RemoteGateway(folder) as gw,
        ):
            report.environment["redis_database"] = redis_url.rsplit("/", 1)[-1]
            if backend == "sqlite":
                store = databases.sqlite_database(folder)
            else:
                store = databases.postgres_database(admin)
            with store as url:
                world = E2EWorld(url, redis_url, gw, folder)
                report.e2e.extend(run_e2e_benchmark(world, sizes.e2e, progress=_progress))
    except Exception:
        report.failures.append(f"end-to-end benchmark:\n{traceback.format_exc()}")


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# --- printing ------------------------------------------------------------------------


def _x(numerator: float, denominator: float) -> str:
    return fmt_ratio(ratio(numerator, denominator))


def _engine_section(report: Report) -> tuple[list[str], list[str]]:
    rows: list[list[str]] = []
    ratios: list[str] = []
    for r in report.engine:
        for side, sample, sql in (
            ("plain", r.plain, r.plain_sql),
            ("agboss", r.agboss, r.agboss_sql),
        ):
            rows.append(
                [
                    r.backend,
                    side,
                    fmt(sample.per_second),
                    fmt(sample.p50_ms, 2),
                    fmt(sample.p95_ms, 2),
                    fmt(sql.statements),
                    fmt(sql.transactions),
                ]
            )
        ratios.append(
            f"ratio: engine {r.backend:<13}"
            f"  throughput {_x(r.agboss.per_second, r.plain.per_second)}"
            f"  p50 {_x(r.agboss.p50_ms, r.plain.p50_ms)}"
            f"  p95 {_x(r.agboss.p95_ms, r.plain.p95_ms)}"
            f"  (+{fmt(r.agboss.p50_ms - r.plain.p50_ms, 2)} ms per execution at p50)"
        )
    lines = [
        "Engine (no broker, one thread): ExecutionContext acquire + outbound + fenced effect"
        " + release,",
        "vs a direct gateway call + a plain INSERT; "
        f"{report.engine[0].plain.count} executions per side, interleaved",
        table(["backend", "side", "exec/s", "p50 ms", "p95 ms", "SQL/exec", "commits/exec"], rows),
        "",
    ]
    return lines, ratios


def _e2e_section(report: Report) -> tuple[list[str], list[str]]:
    rows = [
        [
            run.spec.label,
            run.side,
            str(run.tasks),
            fmt(run.publish_seconds, 2),
            fmt(run.wall_seconds, 2),
            fmt(run.per_second),
            fmt(run.memory.rss_kib / 1024),
            fmt(run.memory.pss_kib / 1024),
            str(run.memory.processes),
        ]
        for run in report.e2e
    ]
    ratios: list[str] = []
    by_key = {(run.spec.label, run.side): run for run in report.e2e}
    for label in dict.fromkeys(run.spec.label for run in report.e2e):
        plain, agboss = by_key.get((label, "plain")), by_key.get((label, "agboss"))
        if plain is None or agboss is None:
            continue
        extra_mib = (agboss.memory.rss_kib - plain.memory.rss_kib) / 1024
        ratios.append(
            f"ratio: e2e {label:<16}"
            f"  tasks/s {_x(agboss.per_second, plain.per_second)}"
            f"  wall {_x(agboss.wall_seconds, plain.wall_seconds)}"
            f"  RSS {_x(agboss.memory.rss_kib, plain.memory.rss_kib)} (+{fmt(extra_mib)} MiB)"
            f"  PSS {_x(agboss.memory.pss_kib, plain.memory.pss_kib)}"
        )
    headers = ["pool", "side", "tasks", "publish s", "wall s", "tasks/s", "RSS MiB", "PSS MiB"]
    lines = [
        "End-to-end: a celery worker subprocess, Redis broker + result backend, store on "
        f"{report.e2e_backend};",
        f"{report.e2e[0].tasks} tasks per side; wall: from the first publish until every "
        "result is in the backend;",
        "memory: the worker's process group right after the run",
        table([*headers, "procs"], rows),
        "",
    ]
    return lines, ratios


def render(report: Report) -> str:
    env = report.environment
    versions = ("python", "celery", "sqlalchemy", "sqlite", "postgresql", "redis")
    lines = [
        f"celery_agboss benchmark, {report.started:%Y-%m-%d %H:%M} UTC",
        f"machine: {env.get('cores')} cores ({env.get('cpu')}), "
        f"load average at start {env.get('load_average_at_start')}",
        "versions: " + ", ".join(f"{k} {env[k]}" for k in versions if k in env),
        "",
    ]
    ratio_lines: list[str] = []
    for present, section in ((report.engine, _engine_section), (report.e2e, _e2e_section)):
        if present:
            more, ratios = section(report)
            lines += more
            ratio_lines += ratios
    if ratio_lines:
        lines += [
            "Ratios, celery_agboss / plain (throughput below 1x is slower; latency, wall "
            "time and memory above 1x are more):",
            *ratio_lines,
            "",
        ]
    lines += [f"note: {note}" for note in report.notes]
    lines += [f"FAILED: {failure}" for failure in report.failures]
    return "\n".join(lines).rstrip() + "\n"


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
        "e2e_backend": report.e2e_backend,
        "e2e": [
            {
                "pool": run.spec.pool,
                "concurrency": run.spec.concurrency,
                "side": run.side,
                "tasks": run.tasks,
                "publish_seconds": clean(run.publish_seconds),
                "wall_seconds": clean(run.wall_seconds),
                "per_second": clean(run.per_second),
                "rss_kib": run.memory.rss_kib,
                "pss_kib": run.memory.pss_kib,
                "processes": run.memory.processes,
            }
            for run in report.e2e
        ],
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
            if not args.e2e_only:
                _run_engine(args, sizes, folder, report)
            if not args.engine_only:
                _run_e2e(args, sizes, folder, report)
    except (KeyboardInterrupt, SystemExit):
        _progress("interrupted: workers stopped, databases dropped, nothing printed")
        raise
    report.notes.append(f"whole run took {time.monotonic() - began:.0f} s")
    print(render(report), end="", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(_as_json(report), indent=2) + "\n", encoding="utf-8")
    return 1 if report.failures else 0


__all__ = ["main", "parse_args", "render"]
