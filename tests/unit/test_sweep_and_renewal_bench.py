"""The sweep-cost and renewal benchmarks still run, at toy sizes (docs/benchmarks.md).

What they measure is theirs to print, never a timed assertion here: only that a run
does its work (every stranded execution re-driven, every lease renewed by one process)
and reports the ``name=value`` metrics ``make bench`` prints.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.renewal_bench import RenewalSizes, run_renewal_benchmark
from bench.sweep_bench import (
    QueryPlan,
    SweepSizes,
    run_sqlite_sweep_benchmark,
    run_sweep_benchmark,
)
from tests.support import services

TOY = SweepSizes(small=50, large=500, stranded=6, rounds=2)
"""Each round checks its pass re-drove every stranded execution and found every intent."""


def _quiet(_: str) -> None:
    """The benchmarks' progress lines: not needed here."""


def test_a_full_scan_is_found_in_either_databases_plan() -> None:
    postgres = QueryPlan("SELECT …", "{}", "Limit\n  ->  Seq Scan on agboss_executions  (cost=…)")
    sqlite = QueryPlan("SELECT …", "()", "SCAN agboss_leases USING INDEX ix_x\nSCAN CONSTANT ROW")
    searched = QueryPlan("SELECT …", "()", "SEARCH agboss_leases USING INDEX pk (scope=?)")
    assert postgres.full_scans == ("agboss_executions",)
    assert sqlite.full_scans == ("agboss_leases", "CONSTANT")
    assert searched.full_scans == ()


@pytest.mark.sqlite
def test_the_sweep_benchmark_redrives_every_stranded_execution_on_sqlite(tmp_path: Path) -> None:
    result = run_sqlite_sweep_benchmark(tmp_path, TOY, _quiet)
    assert [len(run.sweep_seconds) for run in result.runs] == [TOY.rounds] * 2
    assert result.plans, "no statement of the timed pass was explained"
    metrics = result.metrics()
    assert set(metrics) >= {"sweep_sqlite_ratio", "sweep_sqlite_history_scans"}
    assert not math.isnan(metrics["sweep_sqlite_ratio"])


@pytest.mark.postgres
def test_the_sweep_benchmark_redrives_every_stranded_execution_on_postgresql() -> None:
    admin = services.require(services.POSTGRES)
    result = run_sweep_benchmark(admin, TOY, _quiet)
    assert [len(run.sweep_seconds) for run in result.runs] == [TOY.rounds] * 2
    assert any("Execution Time" in plan.plan for plan in result.plans)  # EXPLAIN ANALYZE
    assert result.metrics()["sweep_ratio"] > 0
    assert "ratio: sweep postgresql" in "\n".join(result.lines())


@pytest.mark.postgres
@pytest.mark.redis
def test_the_renewal_benchmark_counts_one_process_renewing_every_lease_at_once() -> None:
    admin = services.require(services.POSTGRES)
    redis_url = services.require(services.REDIS)
    result = run_renewal_benchmark(admin, redis_url, RenewalSizes((1, 3), 4.0), _quiet)
    assert [run.tasks for run in result.runs] == [1, 3]
    assert all(run.processes == 1 and run.updates >= 2 for run in result.runs)
    assert result.runs[-1].leases_per_update > 1  # one UPDATE renews several leases
    assert "renewal_statements_per_interval" in result.metrics()
