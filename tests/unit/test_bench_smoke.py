"""The benchmark script still runs (``make bench``; docs/benchmarks.md).

Only that it finishes and prints its ratios and ``name=value`` lines is checked, and
how it names transactions and judges goals: speed and memory are the benchmark's
business, never timed assertions in the test suite.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.sqlite


def test_the_quick_engine_benchmark_on_sqlite_exits_cleanly_and_prints_a_ratio() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "run.py"),
            "--quick",
            "--engine-only",
            "--backends",
            "sqlite",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert re.search(r"^ratio: engine sqlite\s.*throughput \d+\.\d+x", completed.stdout, re.M), (
        output
    )
    assert "FAILED" not in completed.stdout, output
    assert re.search(r"^commits_per_task=n/a$", completed.stdout, re.M), output
    assert re.search(
        r"^goal throughput_ratio >= 0\.7 \(stretch 0\.8\): not measured", completed.stdout, re.M
    ), output


def _frames_of_a_fake_store_call(module: str) -> dict[str, Any]:
    """Functions compiled as if they lived in ``module``: ``_begin`` classifies its stack."""
    from bench.transaction_kinds import classify

    namespace: dict[str, Any] = {"__name__": module, "sys": sys, "classify": classify}
    exec(  # the classifier reads module names off frames: make such frames
        "def _begin():\n    return classify(sys._getframe(0))\n"
        "def start_delivery():\n    return _begin()\n"
        "def a_new_step():\n    return _begin()\n",
        namespace,
    )
    return namespace


def test_a_store_transaction_is_named_by_the_innermost_celery_agboss_step_it_knows() -> None:
    fake = _frames_of_a_fake_store_call("celery_agboss.store.fake")
    assert fake["start_delivery"]() == "start"


def test_a_transaction_from_an_unknown_step_shows_the_steps_name() -> None:
    fake = _frames_of_a_fake_store_call("celery_agboss.store.fake")
    assert fake["a_new_step"]() == "other:store.fake.a_new_step"
    outside = _frames_of_a_fake_store_call("somebody_else")
    assert outside["start_delivery"]() == "other:outside celery_agboss"


def test_a_missed_goal_says_by_how_much() -> None:
    from bench.report import Goal

    at_most = Goal("commits_per_task", at_most=True, target=5.0, stretch=4.0)
    assert "MISSED by 1.00 (20% over) at 6.00" in at_most.verdict(6.0)
    assert "met at 4.50; stretch missed by 0.50" in at_most.verdict(4.5)
    assert "met, stretch too" in at_most.verdict(3.9)
    at_least = Goal("throughput_ratio", at_most=False, target=0.7)
    assert "MISSED by 0.35 (50% short) at 0.35" in at_least.verdict(0.35)
    assert at_least.verdict(float("nan")).endswith("not measured in this run")


TRACE = (
    'F\t10\tQuery\t "BEGIN"\nB\t10\tCommandComplete\t "BEGIN"\nB\t5\tReadyForQuery\t T\n'
    'F\t40\tParse\t "" "UPDATE agboss_leases\n  SET x = $1" 1 NNNN\nF\t22\tBind\t "" "" 1\n'
    "F\t4\tSync\nB\t5\tReadyForQuery\t T\n"
    'F\t11\tQuery\t "COMMIT"\nB\t5\tReadyForQuery\t I\n'
    'F\t27\tParse\t "_pg3_0" "INSERT INTO t VALUES ($1)" 1 NNNN\nF\t4\tSync\n'
    "B\t4\tParseComplete\nB\t5\tReadyForQuery\t I\n"
    'F\t28\tBind\t "" "_pg3_0" 1\nF\t4\tSync\nB\t5\tReadyForQuery\t I\n'
    'F\t13\tQuery\t "SELECT 1"\nB\t5\tReadyForQuery\t I\n'
)


def test_the_wire_count_names_each_round_trip_and_counts_autocommit_transactions() -> None:
    from bench.wire_trace import parse_trace

    count = parse_trace(TRACE)
    assert dict(count.exchanges) == {
        "begin": 1,
        "statement": 2,
        "commit": 1,
        "prepare": 1,
        "ping": 1,
    }
    assert count.round_trips == 6
    assert count.autocommit == 1  # the prepared INSERT, sent outside BEGIN … COMMIT
    assert count.transactions == 2


def test_the_issue_26_goals_are_judged() -> None:
    from bench.report import GOALS

    goals = {goal.metric: goal for goal in GOALS}
    assert "MISSED by 35.00" in goals["round_trips_per_delivery"].verdict(41.0)
    assert "met, stretch too" in goals["store_to_floor_ratio"].verdict(1.4)
    assert set(goals) >= {"outbound_added_p50_ms", "throughput_ratio_50ms"}


def test_cpu_is_split_by_process_kind() -> None:
    import os

    from bench.cpu_split import ProcessCpu, cpu_snapshot, cpu_spent, kind_of

    mine = cpu_snapshot()
    assert os.getpid() in mine  # the publisher reads itself
    workers = {100: {100, 101, 102}}

    def kind(pid: int, command: str) -> str:
        return kind_of(pid, command, workers=workers, gateway=200)

    before = {
        100: ProcessCpu("celery worker", 1.0),
        101: ProcessCpu("celery worker", 2.0),
        300: ProcessCpu("postgres: postgres bench 127.0.0.1", 0.5),
        400: ProcessCpu("postgres: postgres bench 127.0.0.1", 9.0),
    }
    after = {
        100: ProcessCpu("celery worker", 1.5),
        101: ProcessCpu("celery worker", 2.25),
        102: ProcessCpu("celery worker", 0.25),  # started during the round: from zero
        200: ProcessCpu("python -m bench.gateway_http", 0.5),
        300: ProcessCpu("postgres: postgres bench 127.0.0.1", 1.0),
        400: ProcessCpu("/usr/bin/redis-server 127.0.0.1:6379", 0.75),  # a pid reused
        500: ProcessCpu("sshd", 3.0),
    }
    assert cpu_spent(before, after, kind) == {
        "worker main": 0.5,
        "worker child": 0.5,
        "gateway": 0.5,
        "postgres": 0.5,
        "redis": 0.75,
        "other": 3.0,
    }


def test_the_counter_times_each_statement_of_its_database(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text

    from bench.transaction_kinds import (
        STATEMENT_MICROSECONDS,
        STATEMENTS,
        TransactionCounter,
        read_counts,
    )

    path = str(tmp_path / "timed.db")
    engine = create_engine(f"sqlite:///{path}")
    other = create_engine(f"sqlite:///{tmp_path / 'other.db'}")
    counter = TransactionCounter(tmp_path, "worker", path)
    counter.install(engine)
    counter.install(other)
    try:
        with engine.connect() as conn:
            for _ in range(3):
                conn.execute(text("SELECT 1")).scalar_one()
        with other.connect() as conn:  # another database: not timed
            conn.execute(text("SELECT 1")).scalar_one()
        counter.flush()
        timings = read_counts(tmp_path, "timings")["worker"]
        assert timings[STATEMENTS] == 3
        assert timings[STATEMENT_MICROSECONDS] > 0
        assert read_counts(tmp_path)["worker"]  # the BEGINs are still counted
    finally:
        engine.dispose()
        other.dispose()
