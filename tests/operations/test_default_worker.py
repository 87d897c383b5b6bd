"""The default worker runs the sweep (design: sweep): recovery never depends on a flag or a process.

A worker started without ``-Q`` consumes the sweep queue too; one whose ``-Q`` leaves it
out says so once, when it is ready; ``agboss_sweep_interval = 0`` turns it all off.
While no sweep has finished for three intervals, each worker's watch runs the sweep
itself, once per tick between all of them, until another sweeper (beat) is back.
The worker here is Celery's ``worker_init``/``worker_ready`` signals sent with a stand-in
for the worker (the real thing, a ``celery worker`` process with the README's flags, is
in tests/deployment).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from celery import signals

from celery_agboss.store import audit_trail as q
from celery_agboss.sweep import run_sweep
from tests.operations.conftest import WorldFactory
from tests.operations.world import World
from tests.support.processes import wait_until

_INTERVAL = 0.3
"""The sweep interval of the beat-less test: short, so that three intervals pass quickly."""


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
    first = world_factory(sweep_interval=_INTERVAL)
    second = world_factory(sweep_interval=_INTERVAL)
    stranded = first.publish()
    first.start(stranded)
    first.die()  # a worker was killed mid-body; no beat is deployed
    with _a_worker(first), _a_worker(second):
        wait_until(
            lambda: first.publishes_of(stranded) >= 2,
            15,
            message="the workers' own sweep to re-drive it",
        )
        # The re-publish happens mid-sweep; the sweep records itself only once its
        # last step is done, a moment later (longer on a busy machine).
        by_workers = wait_until(
            lambda: first.agboss.executions.get_meta(q.LAST_WORKER_SWEEP_KEY),
            15,
            message="the workers' own sweep to record that it finished",
        )
        assert by_workers is not None and '"by": "worker"' in by_workers[0]
        assert first.publishes_of(stranded) == 2, "once, though two workers sweep"
        assert first.agboss.executions.get_meta(q.LAST_SWEEP_KEY) is None, "still stale"
        # Beat is back: its sweeps arrive every tick, and the workers' own sweeps stop.
        _assert_the_workers_stop_while_beat_sweeps(first, timeout=20)


_SETTLE_TICKS = 3
"""Once beat is back, a watch that judged "stale" just before may still end one sweep."""
_QUIET_TICKS = 5
"""Then, while beat's sweeps arrive on time, the workers record none (watches look each tick)."""
_BEAT_LATE_MS = round(2 * _INTERVAL * 1000)
"""A gap this long between beat's records voids the window: near three intervals the
workers rightly judge "stale" and sweep again, and a busy machine can starve this beat."""


def _assert_the_workers_stop_while_beat_sweeps(world: World, *, timeout: float) -> None:
    """Beat's sweeps, every 0.1 s, until for settle + quiet ticks in a row they arrived on
    time and no sweep of the workers' own began after the settle ticks. Waiting on that,
    not on a fixed time: a window in which this test's beat fell behind proves nothing
    either way, so it starts again (bounded by ``timeout``). A workers' sweep is judged
    by when it began (the tick it claimed), not by when it wrote its record: on a busy
    machine one that began while beat was late can finish ticks later."""
    interval_ms = round(_INTERVAL * 1000)
    started = time.monotonic()
    window = world.agboss.store.now_ms()
    beat_at: int | None = None
    worker_at = _recorded_at(world, q.LAST_WORKER_SWEEP_KEY)
    voided = settled_again = 0
    while world.agboss.store.now_ms() - window < (_SETTLE_TICKS + _QUIET_TICKS) * interval_ms:
        assert time.monotonic() - started < timeout, (
            f"never {_SETTLE_TICKS + _QUIET_TICKS} ticks in a row of beat on time and the "
            f"workers' own sweeps stopped ({voided} windows voided: beat was late; "
            f"{settled_again} by a sweep of the workers' own)"
        )
        run_sweep(world.agboss, claim_tick=True, by="beat")
        previous_beat_at, beat_at = beat_at, _recorded_at(world, q.LAST_SWEEP_KEY)
        assert beat_at is not None, "beat's sweep records last_sweep_at"
        previous_worker_at, worker_at = worker_at, _recorded_at(world, q.LAST_WORKER_SWEEP_KEY)
        if previous_beat_at is not None and beat_at - previous_beat_at >= _BEAT_LATE_MS:
            voided += 1
            window = world.agboss.store.now_ms()
        elif worker_at != previous_worker_at:
            began_ms = _workers_sweep_began(world, interval_ms)
            settling = began_ms < window + _SETTLE_TICKS * interval_ms
            assert settling, "a workers' sweep began while beat's arrived on time"
            settled_again += 1
            window = world.agboss.store.now_ms()  # it began before beat was back: settle again
        time.sleep(0.1)


def _workers_sweep_began(world: World, interval_ms: int) -> int:
    """When the workers' last own sweep began (database clock): the start of the tick it
    claimed, or, for an attempt that found the tick taken (it records too), its record's
    time: one statement after it began."""
    found = world.agboss.executions.get_meta(q.LAST_WORKER_SWEEP_KEY)
    assert found is not None
    tick = json.loads(found[0])["tick"]
    return found[1] if tick is None else int(tick) * interval_ms


def _recorded_at(world: World, key: str) -> int | None:
    """When the sweep record ``key`` was last written (database clock), if ever."""
    found = world.agboss.executions.get_meta(key)
    return None if found is None else found[1]
