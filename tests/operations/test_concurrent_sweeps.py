"""Two beats, two sweepers (design: trap 10): each execution is re-published once per tick.

Sweepers in two threads of this process, each with its own app and connection pool (as
two processes would have), and one sweeper in a real second process
(``celery -A … agboss sweep --json``). Each twin switches a protection off and shows
the duplicate publishes.
"""

from __future__ import annotations

import json
import signal
import threading
import time

from celery_agboss.core.protections import REDRIVE_WITHOUT_CLAIM, SWEEP_WITHOUT_TICK
from celery_agboss.sweep import SweepReport, run_sweep
from celery_agboss.testing.switches import sabotage
from tests.conftest import ProcessFactory
from tests.operations.cli import REPO_ROOT, ops_app_command, ops_app_env
from tests.operations.conftest import WorldFactory
from tests.operations.world import GRACE_SECONDS, INTERVAL_SECONDS, World

EXECUTIONS = 24
RACE_BATCH = 2


def _lost_messages(world: World, count: int = EXECUTIONS) -> list[str]:
    """``count`` executions whose messages were lost before any worker started them."""
    ids = [world.publish(f"order-{n}") for n in range(count)]
    world.clock.advance(GRACE_SECONDS + 1)
    return ids


def _start_of_a_tick(world: World) -> None:
    """Move the database clock to 1 s into a tick, so the next runs share it."""
    interval_ms = INTERVAL_SECONDS * 1000
    into = world.agboss.store.now_ms() % interval_ms
    world.clock.advance((interval_ms - into + 1000) / 1000)


def _race(*sweeps: World) -> list[SweepReport]:
    barrier = threading.Barrier(len(sweeps))
    reports: list[SweepReport] = []
    errors: list[BaseException] = []

    def run(world: World) -> None:
        try:
            barrier.wait(10)
            reports.append(run_sweep(world.agboss, batch_size=EXECUTIONS))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in sweeps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return reports


def test_two_sweepers_at_once_republish_each_execution_once(
    world_factory: WorldFactory,
) -> None:
    """Trap 10 / P4: the claim is a compare-and-set, so the racing sweeper gets nothing."""
    first, second = world_factory(), world_factory()
    ids = _lost_messages(first)
    reports = _race(first, second)
    assert sum(r.republished for r in reports) == EXECUTIONS
    for task_id in ids:
        assert first.publishes_of(task_id) == 2, task_id
        assert first.execution(task_id).recovery_count == 1


def test_without_the_claim_two_sweepers_republish_each_execution_twice(
    world_factory: WorldFactory,
) -> None:
    """The twin: re-publishing what the listing found, without the claim, duplicates."""
    first, second = world_factory(), world_factory()
    ids = _lost_messages(first)
    with sabotage(REDRIVE_WITHOUT_CLAIM):
        run_sweep(first.agboss)
        run_sweep(second.agboss)
    assert all(first.publishes_of(task_id) == 3 for task_id in ids)


RACE_TTL_SECONDS = 5
"""Short (a speed-up): this race waits in real time for the leases to run out."""


RACE_ROUNDS = 3
"""Rounds at most until one is a race: on a loaded machine one sweeper may take every
claim of a round (a relay); each round must still re-publish every execution once."""


def _one_round_against_another_process(
    here: World, managed_process: ProcessFactory, ops_store_url: str, round_no: int
) -> tuple[list[str], list[str], list[str]]:
    """Both sweep in a loop while N leases run out at the same (real) moment: the ids, and
    what this sweeper and the other process re-published of them."""
    ids = [here.publish(f"order-{round_no}-{n}") for n in range(EXECUTIONS)]
    for task_id in ids:
        here.start(task_id)  # live leases, running out in real time
    config = {"database_url": ops_store_url, "clock_offset_ms": here.clock.offset_ms()}
    sweep = f"agboss sweep --loop --interval 0.1 --max-runs 400 --batch-size {RACE_BATCH} --json"
    other = managed_process(
        ops_app_command(*sweep.split()),
        name=f"sweeper-{round_no}",
        env=ops_app_env(config),
        cwd=str(REPO_ROOT),
    )
    other.wait_until(
        lambda: '"republished"' in other.output(), 30, message="the other sweeper to run"
    )
    ours = set(ids)

    def theirs() -> list[str]:
        found: list[str] = []
        for line in other.output().splitlines():
            try:
                found += json.loads(line)["republished_ids"]
            except (ValueError, KeyError):  # not a report, or one still being written
                continue
        return [task_id for task_id in found if task_id in ours]

    mine: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and set(mine + theirs()) != ours:
        mine += run_sweep(here.agboss, batch_size=RACE_BATCH).republished_ids
        time.sleep(0.01)
    other.send_signal(signal.SIGTERM)
    assert other.wait(30) == 0, other.describe()
    return ids, [task_id for task_id in mine if task_id in ours], theirs()


def test_a_sweeper_in_another_process_and_one_here_republish_each_execution_once(
    world_factory: WorldFactory, managed_process: ProcessFactory, ops_store_url: str
) -> None:
    """Small batches on both sides: with one batch of all 24, whichever sweeper runs first
    after the expiry claims everything before the other is scheduled (a relay, not a
    race); a few claims per sweep make them interleave, and a round that was a relay
    all the same is run again (``RACE_ROUNDS``), every round's publishes checked."""
    here = world_factory(lease_ttl=RACE_TTL_SECONDS)
    rounds: list[tuple[int, int]] = []
    for round_no in range(RACE_ROUNDS):
        ids, mine, theirs = _one_round_against_another_process(
            here, managed_process, ops_store_url, round_no
        )
        assert sorted(mine + theirs) == sorted(ids)  # every execution once, none twice
        rounds.append((len(mine), len(theirs)))
        if mine and theirs:
            break
    assert any(mine and theirs for mine, theirs in rounds), rounds  # a race, not a relay


def test_two_beats_in_one_tick_run_one_sweep(world_factory: WorldFactory) -> None:
    """A per-tick row under a unique key: the second beat's sweep does nothing."""
    first, second = world_factory(), world_factory()
    _start_of_a_tick(first)
    a = run_sweep(first.agboss, claim_tick=True)
    b = run_sweep(second.agboss, claim_tick=True)
    assert sorted([a.ran, b.ran]) == [False, True]
    skipped = b if a.ran else a
    assert skipped.skipped == "another sweeper already ran this tick"
    first.clock.advance(31)
    assert run_sweep(second.agboss, claim_tick=True).ran


def test_without_the_tick_row_two_beats_run_two_sweeps(world_factory: WorldFactory) -> None:
    first, second = world_factory(), world_factory()
    _start_of_a_tick(first)
    with sabotage(SWEEP_WITHOUT_TICK):
        a = run_sweep(first.agboss, claim_tick=True)
        b = run_sweep(second.agboss, claim_tick=True)
    assert a.ran and b.ran
