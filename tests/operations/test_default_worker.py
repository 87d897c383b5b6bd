"""DESIGN §6, "the default worker": recovery never depends on a flag or a process.

A worker started without ``-Q`` consumes the sweep queue too; one whose ``-Q`` leaves it
out says so once, when it is ready; ``agboss_sweep_interval = 0`` turns it all off.
While no sweep has finished for three intervals, each worker's watch runs the sweep
itself, once per tick between all of them, until another sweeper (beat) is back.
The worker here is Celery's ``worker_init``/``worker_ready`` signals sent with a stand-in
for the worker (the real thing, a ``celery worker`` process with the README's flags, is
in tests/deployment).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from celery import signals

from celery_agboss.store import sweep_queries as q
from celery_agboss.sweep import run_sweep
from tests.operations.conftest import WorldFactory
from tests.operations.world import World
from tests.support.processes import wait_until


class _Worker:
    def __init__(self, world: World) -> None:
        self.app = world.app
        self.hostname = "w1@test"


@contextmanager
def _a_worker(world: World, *queues: str) -> Iterator[_Worker]:
    """A worker of ``world``'s app, started with ``-Q queues`` (none: every queue)."""
    worker = _Worker(world)
    if queues:
        world.app.amqp.queues.select(list(queues))
    signals.worker_init.send(sender=worker)
    signals.worker_ready.send(sender=worker)
    try:
        yield worker
    finally:
        signals.worker_shutdown.send(sender=None)


def test_a_worker_without_q_consumes_the_sweep_queue(world: World) -> None:
    with _a_worker(world):
        assert "agboss.sweep" in world.app.amqp.queues.consume_from
        assert "ops" in world.app.amqp.queues.consume_from


def test_a_worker_whose_q_leaves_it_out_says_so_once(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="celery_agboss"), _a_worker(world, "ops"):
        assert "agboss.sweep" not in world.app.amqp.queues.consume_from
    lines = [r for r in caplog.records if "sweep.queue-not-consumed" in r.getMessage()]
    assert len(lines) == 1


def test_interval_zero_turns_the_sweep_queue_and_the_workers_sweeps_off(
    world_factory: WorldFactory,
) -> None:
    world = world_factory(sweep_interval=0)
    with _a_worker(world):
        assert "agboss.sweep" not in world.app.amqp.queues.consume_from


def test_without_a_beat_the_workers_sweep_once_per_tick_until_beat_is_back(
    world_factory: WorldFactory,
) -> None:
    first, second = world_factory(sweep_interval=0.3), world_factory(sweep_interval=0.3)
    stranded = first.publish()
    first.start(stranded)
    first.die()  # a worker was killed mid-body; no beat is deployed
    with _a_worker(first), _a_worker(second):
        wait_until(
            lambda: first.publishes_of(stranded) >= 2,
            15,
            message="the workers' own sweep to re-drive it",
        )
        assert first.publishes_of(stranded) == 2, "once, though two workers sweep"
        by_workers = first.agboss.executions.get_meta(q.LAST_WORKER_SWEEP_KEY)
        assert by_workers is not None and '"by": "worker"' in by_workers[0]
        assert first.agboss.executions.get_meta(q.LAST_SWEEP_KEY) is None, "still stale"
        # Beat is back: its sweeps arrive every tick; the workers' own sweeps stop. One
        # that had claimed its tick before beat's first sweep may still be finishing.
        settle = time.monotonic() + 2 * 0.3
        while time.monotonic() < settle:
            run_sweep(first.agboss, claim_tick=True, by="beat")
            time.sleep(0.1)
        at_return = _worker_sweeps(first)
        deadline = time.monotonic() + 5 * 0.3  # five ticks: the watches look at each
        while time.monotonic() < deadline:
            run_sweep(first.agboss, claim_tick=True, by="beat")
            assert _worker_sweeps(first) == at_return, "the workers stopped sweeping"
            time.sleep(0.1)


def _worker_sweeps(world: World) -> int | None:
    found = world.agboss.executions.get_meta(q.LAST_WORKER_SWEEP_KEY)
    return None if found is None else found[1]
