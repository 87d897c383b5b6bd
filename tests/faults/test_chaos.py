"""The chaos explorer (``python -m celery_agboss.chaos``), run as a user runs it.

- the short run: 24 orders in 12 s through the generated shop on three real workers and
  a beat, the default fault mix (kills, freezes, SIGTERMs, the gateway's own faults),
  its first fault forced to be a pool child SIGKILLed right after the gateway charged
  (s03); the verdict has no double charge, no lost order, no phantom refund, and the
  explorer exits 0: on SQLite+Redis and on PostgreSQL+Redis;
- its sabotage run (PostgreSQL+Redis): the same first fault with reconcile switched
  off in the workers (``NOT_RECONCILED``): the explorer counts a second payment at
  its gateway and exits 1;
- its options: a bad ``--store``, ``--store postgres`` without a database, and an
  unreachable broker each exit 2 with a message naming what to change (no service).

Each run gets a fresh store (``sqlite_url`` / ``empty_postgres_url``) and a Redis
database of its own (``redis_url_factory``); the explorer makes its own queues in it.
Speed-ups: the explorer's own, all documented ``agboss_*`` settings it prints (lease
TTL 5 s, sweep every 2 s, requested grace 3 s, retry delay 1 s).
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from celery_agboss.chaos import EXIT_COULD_NOT_RUN, EXIT_MONEY_WRONG, EXIT_OK
from tests.faults.scenario import NOT_RECONCILED, POSTGRES_REDIS, SQLITE_REDIS, Stack
from tests.support.processes import ManagedProcess, WaitTimeout

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ProcessFactory = Callable[..., ManagedProcess]

RUN_SECONDS = 240.0  # the explorer bounds itself; this only catches a hung explorer
SHORT_ORDERS = 24  # three of them (4, 13, 22) pay with the card the gateway declines
SHORT_RUN = [
    *("--orders", str(SHORT_ORDERS), "--fault-seconds", "12"),
    *("--seed", "1010", "--first-fault", "kill-child-after-charge"),
]
SABOTAGE_RUN = [
    "--orders",
    "12",
    "--seed",
    "1010",
    "--faults",
    "kill-child-after-charge",
    "--max-faults",
    "2",
    "--fault-seconds",
    "10",
    "--quiet-seconds",
    "60",
]


def explore(
    managed_process: ProcessFactory,
    tmp_path: Path,
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = RUN_SECONDS,
) -> tuple[int, dict[str, Any], str]:
    """Run the explorer to its end: (exit code, its JSON verdict, its output)."""
    verdict_path = tmp_path / f"verdict-{len(list(tmp_path.glob('verdict-*')))}.json"
    process = managed_process(
        [sys.executable, "-m", "celery_agboss.chaos", *args, "--json", str(verdict_path)],
        name="chaos",
        env={"TMPDIR": str(tmp_path), **(env or {})},  # a kept run directory stays here
    )
    try:
        code = process.wait(timeout)
    except WaitTimeout:
        process.signal_leader(signal.SIGTERM)  # the explorer ends its own workers
        process.wait(60)
        raise AssertionError(f"the explorer ran past {timeout:g} s\n{process.tail(80)}") from None
    output = process.output()
    verdict = json.loads(verdict_path.read_text()) if verdict_path.exists() else {}
    return code, verdict, output


def assert_money_right(code: int, verdict: dict[str, Any], output: str, orders: int) -> None:
    assert verdict, f"no verdict written (exit {code})\n{output}"
    assert (verdict["paid_twice"], verdict["lost"], verdict["phantom_refunds"]) == (0, 0, 0), output
    settled = verdict["paid_once"] + verdict["declined"] + verdict["waiting_for_operator"]
    assert settled == orders, output
    assert verdict["declined"] > 0, "the gateway's deterministic declines are a real row"
    assert verdict["faults"].get("kill-child-after-charge", 0) >= 1, output
    assert code == EXIT_OK, output


@pytest.mark.parametrize("empty_stack", [SQLITE_REDIS, POSTGRES_REDIS], indirect=True)
def test_chaos_short_run_pays_every_order_once(
    managed_process: ProcessFactory, tmp_path: Path, empty_stack: Stack
) -> None:
    broker_url, database_url = empty_stack
    store = "sqlite" if database_url.startswith("sqlite") else "postgres"
    code, verdict, output = explore(
        managed_process,
        tmp_path,
        [*SHORT_RUN, "--store", store, "--database-url", database_url, "--broker", broker_url],
    )
    assert_money_right(code, verdict, output, SHORT_ORDERS)


@pytest.mark.postgres
def test_chaos_sabotaged_reconcile_off_is_reported_paid_twice_and_exits_1(
    managed_process: ProcessFactory,
    tmp_path: Path,
    empty_postgres_url: str,
    redis_url_factory: Callable[[], str],
) -> None:
    """The workers resend a pending charge without looking it up first: the child killed
    after the gateway charged leaves its order paid twice, which the explorer counts at
    its gateway (payments per order) and fails on."""
    code, verdict, output = explore(
        managed_process,
        tmp_path,
        [
            *SABOTAGE_RUN,
            "--store",
            "postgres",
            "--database-url",
            empty_postgres_url,
            "--broker",
            redis_url_factory(),
        ],
        env=NOT_RECONCILED,
    )
    assert verdict, f"no verdict written (exit {code})\n{output}"
    assert verdict["paid_twice"] >= 1, output
    assert verdict["faults"].get("kill-child-after-charge", 0) >= 1, output
    assert code == EXIT_MONEY_WRONG, output
    assert "MONEY WRONG" in output


# --- options: no service needed -------------------------------------------------------------


def _run_options(managed_process: ProcessFactory, args: Sequence[str]) -> tuple[int, str]:
    process = managed_process([sys.executable, "-m", "celery_agboss.chaos", *args], name="chaos")
    return process.wait(60), process.output()


def test_chaos_refuses_an_unknown_store_with_the_could_not_run_code(
    managed_process: ProcessFactory,
) -> None:
    code, output = _run_options(managed_process, ["--store", "mysql"])
    assert code == EXIT_COULD_NOT_RUN, output
    assert "--store" in output and "sqlite" in output and "postgres" in output, output


def test_chaos_refuses_postgres_without_a_database_url(
    managed_process: ProcessFactory,
) -> None:
    process = managed_process(
        [sys.executable, "-m", "celery_agboss.chaos", "--store", "postgres"],
        name="chaos",
        env={"AGBOSS_DATABASE_URL": ""},
    )
    code, output = process.wait(60), process.output()
    assert code == EXIT_COULD_NOT_RUN, output
    assert "--database-url" in output and "AGBOSS_DATABASE_URL" in output, output


def test_chaos_names_an_unreachable_broker_and_exits_with_the_could_not_run_code(
    managed_process: ProcessFactory,
) -> None:
    code, output = _run_options(
        managed_process, ["--orders", "1", "--broker", "redis://127.0.0.1:1/0"]
    )
    assert code == EXIT_COULD_NOT_RUN, output
    assert "could not run" in output and "redis://127.0.0.1:1/0" in output, output
    assert "does not answer" in output and "--broker" in output, output
