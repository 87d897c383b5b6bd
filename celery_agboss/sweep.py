"""The sweep (DESIGN §6): what a dead worker, a lost message or a missed answer left behind.

One run, in bounded batches, safe with several beats or sweepers at once:

1. expires ``REQUESTED``/``WAITING`` executions past their ``expires``;
2. reconciles ``PENDING`` intents with no live owner through the registered
   ``OutboundCall`` (the engine's ``reconcile_stranded``, under a short lease of the
   sweeper's own): it stores what the gateway knows and never sends money;
3. ends cancel requests (a revoke, ``cancel()``) once no intent is pending;
4. re-drives every execution with no live lease whose time came: the same message
   again (same id, arguments and options), or ``PARKED`` past the recovery cap;
5. deletes settled intents and fenced-effect records past their retention;
6. records ``last_sweep_at``, which workers watch (``sweep.stale``).

Every claim is a compare-and-set committed before any gateway call or publish, so two
sweepers decide each row one after the other; a per-tick row makes two beats run one
sweep per tick. The steps themselves are in ``celery_agboss.sweep_steps``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_agboss.core import sabotage
from celery_agboss.events import log_event
from celery_agboss.store import sweep_queries as q
from celery_agboss.sweep_steps import (
    REDRIVE_WITHOUT_CLAIM,
    SWEEP_ERROR,
    SweepReport,
    SweepRun,
    effective_interval,
    send_task_event,
)

if TYPE_CHECKING:
    from celery_agboss.app import AGBoss

logger = logging.getLogger("celery_agboss")

SWEEP_TASK_NAME = "celery_agboss.sweep"
DEFAULT_BATCH_SIZE = 200
STALE_AFTER_INTERVALS = 3

SWEEP_FINISHED = "sweep.finished"
SWEEP_SKIPPED = "sweep.skipped"
SWEEP_STALE = "sweep.stale"

SWEEP_WITHOUT_TICK = sabotage.register("sweep-without-tick")
"""Sabotage (trap 10): every beat's sweep runs, even when another already ran this tick."""


def run_sweep(
    agboss: AGBoss,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    claim_tick: bool = False,
    interval_seconds: float | None = None,
) -> SweepReport:
    """One sweep run; never sends money. ``claim_tick``: run only if no other sweeper ran
    this tick (the beat task and ``--loop`` do; an operator's one-off run does not)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    started = time.monotonic()
    report = SweepReport()
    interval = effective_interval(
        agboss.settings.sweep_interval_seconds if interval_seconds is None else interval_seconds
    )
    if claim_tick and not sabotage.active(SWEEP_WITHOUT_TICK):
        tick = q.claim_tick(agboss.store, round(interval * 1000), claimant=str(uuid.uuid4()))
        if tick is None:
            report.skipped = "another sweeper already ran this tick"
            log_event(SWEEP_SKIPPED, reason="tick already swept")
            return report
        report.tick = tick
    run = SweepRun(agboss, batch_size, report)
    steps = (run.expire, run.reconcile, run.cancel, run.redrive, run.retention)
    try:
        for step in steps:
            try:
                step()
            except Exception:
                report.errors += 1
                log_event(SWEEP_ERROR, logging.ERROR, exc_info=True, step=step.__name__)
    finally:
        run.release()
    report.duration_ms = round((time.monotonic() - started) * 1000)
    try:
        agboss.executions.set_meta(
            q.LAST_SWEEP_KEY, json.dumps({**report.as_dict(), "interval_seconds": interval})
        )
    except Exception:
        report.errors += 1
        log_event(SWEEP_ERROR, logging.ERROR, exc_info=True, step="last-sweep-at")
    log_event(SWEEP_FINISHED, **{k: v for k, v in report.as_dict().items() if v})
    return report


def run_sweep_loop(
    agboss: AGBoss,
    *,
    interval_seconds: float | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_runs: int | None = None,
    stop: threading.Event | None = None,
    on_report: Callable[[SweepReport], None] | None = None,
) -> int:
    """Sweep every interval until ``stop`` is set or ``max_runs`` runs were made (for
    deployments without beat); the number of runs. Each run claims its tick, so loops and
    beats can mix. A run that fails (the store is down) is logged and the loop goes on."""
    interval = effective_interval(
        agboss.settings.sweep_interval_seconds if interval_seconds is None else interval_seconds
    )
    interval_ms = round(interval * 1000)
    stop = stop or threading.Event()
    runs = 0
    while not stop.is_set() and (max_runs is None or runs < max_runs):
        runs += 1
        try:
            report = run_sweep(
                agboss, batch_size=batch_size, claim_tick=True, interval_seconds=interval
            )
        except Exception:
            log_event(SWEEP_ERROR, logging.ERROR, exc_info=True, step="run")
        else:
            if on_report is not None:
                on_report(report)
        if max_runs is not None and runs >= max_runs:
            break
        # Sleep to the next tick boundary (ticks are the database clock's).
        try:
            now_ms = agboss.store.now_ms()
        except Exception:
            now_ms = int(time.time() * 1000)
        stop.wait(((now_ms // interval_ms + 1) * interval_ms - now_ms) / 1000 + 0.01)
    return runs


# --- last_sweep_at, watched by workers -----------------------------------------------------


@dataclass(frozen=True)
class SweepFreshness:
    last_sweep_age_seconds: float | None  # None: no sweep ever recorded
    interval_seconds: float
    stale: bool


def sweep_freshness(agboss: AGBoss) -> SweepFreshness:
    """How long ago the last sweep finished, on the database clock."""
    interval = effective_interval(agboss.settings.sweep_interval_seconds)
    found = agboss.executions.get_meta(q.LAST_SWEEP_KEY)
    if found is None:
        return SweepFreshness(None, interval, True)
    value, at_ms = found
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        interval = float(json.loads(value).get("interval_seconds") or interval)
    age = max(0.0, (agboss.store.now_ms() - at_ms) / 1000)
    return SweepFreshness(age, interval, age > STALE_AFTER_INTERVALS * interval)


def check_sweep_freshness(agboss: AGBoss) -> SweepFreshness:
    """Log ``sweep.stale`` (a warning) when the last sweep is older than three intervals:
    no beat is running, or its sweeps never reach a worker."""
    freshness = sweep_freshness(agboss)
    if freshness.stale:
        log_event(
            SWEEP_STALE,
            logging.WARNING,
            last_sweep_age_seconds=(
                None if freshness.last_sweep_age_seconds is None
                else round(freshness.last_sweep_age_seconds, 1)
            ),
            interval_seconds=freshness.interval_seconds,
            hint="run celery beat (or celery agboss sweep --loop) and a worker on the "
            "sweep queue",
        )
    return freshness


class _FreshnessWatch:
    """A daemon thread in the worker's main process: checks every interval, the first
    time after three intervals (a fresh deployment's beat gets that long)."""

    def __init__(self, agboss: AGBoss) -> None:
        self.agboss = agboss
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="agboss-sweep-watch", daemon=True)

    def _run(self) -> None:
        interval = effective_interval(self.agboss.settings.sweep_interval_seconds)
        if self.stop.wait(STALE_AFTER_INTERVALS * interval):
            return
        while not self.stop.is_set():
            try:
                interval = check_sweep_freshness(self.agboss).interval_seconds
            except Exception:
                logger.debug("could not check the sweep's freshness", exc_info=True)
            self.stop.wait(interval)


def install(agboss: AGBoss) -> None:
    """Called by ``AGBoss(app)``: the ``celery_agboss.sweep`` task, the workers' watch on
    ``last_sweep_at``, and the recording of revokes made from this process."""
    from celery import signals

    from celery_agboss.revokes import install_revoke_recorder

    app = agboss.app

    @app.task(  # type: ignore[untyped-decorator]
        name=SWEEP_TASK_NAME, shared=False, ignore_result=True
    )
    def sweep(batch_size: int = DEFAULT_BATCH_SIZE) -> dict[str, Any]:
        """Re-drive and reconcile what dead workers and lost messages left behind."""
        interval = agboss.settings.sweep_interval_seconds
        return run_sweep(agboss, batch_size=batch_size, claim_tick=interval > 0).summary()

    watches: list[_FreshnessWatch] = []

    def on_worker_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app or watches:
            return
        watch = _FreshnessWatch(agboss)
        watches.append(watch)
        watch.thread.start()

    def on_worker_shutdown(**_: Any) -> None:
        for watch in watches:
            watch.stop.set()

    signals.worker_ready.connect(on_worker_ready, weak=False)
    signals.worker_shutdown.connect(on_worker_shutdown, weak=False)
    install_revoke_recorder(agboss)


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "REDRIVE_WITHOUT_CLAIM",
    "SWEEP_TASK_NAME",
    "SWEEP_WITHOUT_TICK",
    "SweepFreshness",
    "SweepReport",
    "check_sweep_freshness",
    "install",
    "run_sweep",
    "run_sweep_loop",
    "send_task_event",
    "sweep_freshness",
]
