"""The sweep (design: sweep): what a dead worker, a lost message or a missed answer left behind.

One run, in bounded batches, safe with several beats or sweepers at once:

1. expires ``REQUESTED``/``WAITING`` executions past their ``expires``;
2. reconciles ``PENDING`` intents with no live owner through the registered
   ``OutboundCall`` (the engine's ``reconcile_stranded``, under a short lease of the
   sweeper's own): it stores what the gateway knows and never sends money; it starts
   lookups for one interval at most, the rest are the next run's;
3. ends cancel requests (a revoke, ``cancel()``) once no intent is pending;
4. re-drives every execution with no live lease whose time came: the same message
   again (same id, arguments and options), or ``PARKED`` past the recovery cap;
   re-publishes a ``COMPLETED`` execution whose links (callbacks, the chain's next step)
   never went out, past the same grace (``celery_agboss.sweep.links``);
   then publishes the outbox rows left unpublished past their grace (``celery_agboss.outbox``);
5. deletes settled intents and fenced-effect records past their retention;
6. records ``last_sweep_at``, which workers watch (``sweep.stale``): while no sweep
   finishes for three intervals they run it themselves, once per tick.

A worker started without ``-Q`` (and no ``-X`` naming it) consumes the sweep queue too,
so "run workers and beat as usual" is all a deployment needs; a missing beat delays
recovery by three intervals at most.

Every claim is a compare-and-set committed before any gateway call or publish, so two
sweepers decide each row one after the other; a per-tick row makes two beats run one
sweep per tick. The steps themselves are in ``celery_agboss.sweep.steps``.
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
from typing import Any

from celery import signals as celery_signals

from celery_agboss.core import sabotage
from celery_agboss.core.durations import to_ms
from celery_agboss.core.log_events import (
    SWEEP_ERROR,
    SWEEP_FINISHED,
    SWEEP_QUEUE_NOT_CONSUMED,
    SWEEP_SKIPPED,
    SWEEP_STALE,
    log_event,
)
from celery_agboss.core.protections import SWEEP_WITHOUT_TICK
from celery_agboss.errors import ConfigurationError, StoreError
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.known_settings import effective_interval
from celery_agboss.runtime.settings import AGBossSettings
from celery_agboss.store.audit_trail import LAST_SWEEP_KEY, LAST_WORKER_SWEEP_KEY
from celery_agboss.sweep.steps import SweepReport, SweepRun

logger = logging.getLogger("celery_agboss")

SWEEP_TASK_NAME = "celery_agboss.sweep"
SWEEP_BEAT_ENTRY = SWEEP_TASK_NAME
DEFAULT_BATCH_SIZE = 200
STALE_AFTER_INTERVALS = 3


BY_WORKER = "worker"
"""``by`` of the workers' own sweeps, run while no other sweep finishes (no beat)."""


def run_sweep(
    runtime: Runtime,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    claim_tick: bool = False,
    interval_seconds: float | None = None,
    by: str = "operator",
) -> SweepReport:
    """One sweep run; never sends money. ``claim_tick``: run only if no other sweeper ran
    this tick (the beat task, ``--loop`` and the workers' own sweeps do; an operator's
    one-off run does not). ``by`` says who ran it: ``beat``, ``loop``, ``operator``, or
    ``worker`` for the workers' own sweeps, which never count as "a sweep finished" —
    the workers keep sweeping until some other sweeper (beat) is back."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    started = time.monotonic()
    report = SweepReport()
    interval = effective_interval(
        runtime.settings.sweep_interval_seconds if interval_seconds is None else interval_seconds
    )
    if claim_tick and not sabotage.active(SWEEP_WITHOUT_TICK):
        tick = runtime.executions.claim_tick(
            to_ms(interval, what="the sweep interval"), claimant=str(uuid.uuid4())
        )
        if tick is None:
            report.skipped = "another sweeper already ran this tick"
            log_event(SWEEP_SKIPPED, reason="tick already swept", by=by)
            # A beat sweep that reached a worker proves beat works, even when the workers'
            # own sweep took this tick first: record it, so that they stop.
            _record_finished(runtime, report, interval, by)
            return report
        report.tick = tick
    # The reconcile step's lookups may take one interval (then at most one more lookup):
    # a gateway whose lookups hang never holds back the re-drive and cancel steps.
    run = SweepRun(runtime, batch_size, report, reconcile_budget_seconds=interval)
    steps = (
        run.expire,
        run.reconcile,
        run.cancel,
        run.held,
        run.redrive,
        run.links,
        run.outbox,
        run.retention,
    )
    try:
        for step in steps:
            try:
                step()
            except (Exception, StoreError):
                report.errors += 1
                log_event(SWEEP_ERROR, logging.ERROR, exc_info=True, step=step.__name__)
    finally:
        run.release()
    report.duration_ms = round((time.monotonic() - started) * 1000)
    _record_finished(runtime, report, interval, by)
    log_event(SWEEP_FINISHED, by=by, **{k: v for k, v in report.as_dict().items() if v})
    return report


def _record_finished(runtime: Runtime, report: SweepReport, interval: float, by: str) -> None:
    """``last_sweep_at`` (what workers watch), or, for the workers' own sweeps, a key of
    their own: those must not hide that no beat is running."""
    key = LAST_WORKER_SWEEP_KEY if by == BY_WORKER else LAST_SWEEP_KEY
    value = json.dumps({**report.as_dict(), "interval_seconds": interval, "by": by})
    try:
        runtime.executions.set_meta(key, value)
    except (Exception, StoreError):
        report.errors += 1
        log_event(SWEEP_ERROR, logging.ERROR, exc_info=True, step="last-sweep-at")


def run_sweep_loop(
    runtime: Runtime,
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
        runtime.settings.sweep_interval_seconds if interval_seconds is None else interval_seconds
    )
    interval_ms = to_ms(interval, what="the sweep interval")
    stop = stop or threading.Event()
    runs = 0
    while not stop.is_set() and (max_runs is None or runs < max_runs):
        runs += 1
        try:
            report = run_sweep(
                runtime,
                batch_size=batch_size,
                claim_tick=True,
                interval_seconds=interval,
                by="loop",
            )
        except (Exception, StoreError):
            log_event(SWEEP_ERROR, logging.ERROR, exc_info=True, step="run")
        else:
            if on_report is not None:
                on_report(report)
        if max_runs is not None and runs >= max_runs:
            break
        # Sleep to the next tick boundary (ticks are the database clock's).
        try:
            now_ms = runtime.store.now_ms()
        except (Exception, StoreError):
            now_ms = int(time.time() * 1000)
        stop.wait(((now_ms // interval_ms + 1) * interval_ms - now_ms) / 1000 + 0.01)
    return runs


# --- last_sweep_at, watched by workers -----------------------------------------------------


@dataclass(frozen=True)
class SweepFreshness:
    last_sweep_age_seconds: float | None  # None: no sweep ever recorded
    interval_seconds: float
    stale: bool


def sweep_freshness(runtime: Runtime) -> SweepFreshness:
    """How long ago the last sweep finished, on the database clock. The clock is read
    first: a pause between the two reads (a busy worker) can then only make the last
    sweep look younger, never stale while beat's sweeps arrive."""
    interval = effective_interval(runtime.settings.sweep_interval_seconds)
    now_ms = runtime.store.now_ms()
    found = runtime.executions.get_meta(LAST_SWEEP_KEY)
    if found is None:
        return SweepFreshness(None, interval, True)
    value, at_ms = found
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        interval = float(json.loads(value).get("interval_seconds") or interval)
    age = max(0.0, (now_ms - at_ms) / 1000)
    return SweepFreshness(age, interval, age > STALE_AFTER_INTERVALS * interval)


WATCH_JOIN_SECONDS = 10.0
"""At worker shutdown, how long its watch's sweep in progress may take to end."""

STALE_LOG_EVERY_INTERVALS = 10
"""While the sweep stays stale, each worker repeats its warning this seldom."""


def check_sweep_freshness(runtime: Runtime, *, workers_sweep: bool = False) -> SweepFreshness:
    """Log ``sweep.stale`` (a warning) when the last sweep is older than three intervals:
    no beat is running, or its sweeps never reach a worker."""
    freshness = sweep_freshness(runtime)
    if freshness.stale:
        log_event(
            SWEEP_STALE,
            logging.WARNING,
            last_sweep_age_seconds=(
                None
                if freshness.last_sweep_age_seconds is None
                else round(freshness.last_sweep_age_seconds, 1)
            ),
            interval_seconds=freshness.interval_seconds,
            workers_sweep=workers_sweep,
            hint="run celery beat (or celery agboss sweep --loop) beside a worker that "
            "consumes the sweep queue (a worker started without -Q does)"
            + ("; meanwhile the workers sweep themselves, once per tick" if workers_sweep else ""),
        )
    return freshness


class _SweepWatch:
    """A daemon thread in each worker's main process, on ``last_sweep_at``.

    While no sweep has finished for three intervals (beat not deployed, down, or its
    sweeps reaching no worker), it warns and runs the sweep itself at every tick of the
    database clock; ``claim_tick`` makes that one sweep per tick however many workers
    try. Its own runs never count as "a sweep finished", so the workers stop as soon as
    beat's sweeps arrive again. The first judgement waits three intervals after the
    worker started: a fresh deployment's beat gets that long.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="agboss-sweep-watch", daemon=True)
        self._since_warning: int | None = None

    @property
    def sweeps_itself(self) -> bool:
        return self.runtime.settings.sweep_interval_seconds > 0

    def _run(self) -> None:
        interval = effective_interval(self.runtime.settings.sweep_interval_seconds)
        if self.stop.wait(STALE_AFTER_INTERVALS * interval):
            return
        while not self.stop.is_set():
            try:
                self._tick()
            except (Exception, StoreError):
                logger.warning("the sweep watch could not look at the store", exc_info=True)
            self.stop.wait(self._until_next_tick(interval))

    def _tick(self) -> None:
        freshness = sweep_freshness(self.runtime)
        if not freshness.stale:
            self._since_warning = None
            return
        if self._since_warning is None or self._since_warning >= STALE_LOG_EVERY_INTERVALS:
            check_sweep_freshness(self.runtime, workers_sweep=self.sweeps_itself)
            self._since_warning = 0
        self._since_warning += 1
        if self.sweeps_itself:
            run_sweep(self.runtime, claim_tick=True, by=BY_WORKER)

    def _until_next_tick(self, interval: float) -> float:
        """Seconds to just after the next tick boundary of the database clock."""
        interval_ms = to_ms(interval, what="the sweep interval")
        try:
            now_ms = self.runtime.store.now_ms()
        except (Exception, StoreError):
            return interval
        return ((now_ms // interval_ms + 1) * interval_ms - now_ms) / 1000 + 0.05


def _declare_the_sweep_queue(runtime: Runtime) -> None:
    """At ``celeryd_init``, as ``celery worker`` makes its worker and before it applies
    ``-Q`` and ``-X``: the sweep queue becomes one of the worker's default queues, so
    Celery's own rules decide whether it is consumed (``-X`` takes it out of the
    defaults, ``-Q`` consumes only what it names). Celery keeps no record of ``-X``
    otherwise: excluding a queue it does not know yet changes nothing it exposes."""
    settings = runtime.settings
    if settings.sweep_interval_seconds <= 0:
        return  # no beat entry: `celery agboss sweep --loop` sweeps instead
    queues = runtime.app.amqp.queues
    if getattr(queues, "_consume_from", None) is None and settings.sweep_queue not in queues:
        queues.select_add(settings.sweep_queue)


def _consume_the_sweep_queue(runtime: Runtime, worker: Any) -> Callable[[], None]:
    """The default worker runs the sweep (design: sweep): a worker started without ``-Q``
    and without ``-X`` naming it consumes the sweep queue too; one whose ``-Q`` leaves it
    out, or whose ``-X`` names it, says so, once. Decided at ``worker_init`` (before the
    consumer starts), after Celery applied ``-Q`` and ``-X`` to a sweep queue declared at
    ``celeryd_init``; a worker made in code (no ``celeryd_init``) that did not declare it
    either gets it added when it has no ``-Q``. What to say is returned, to be said once
    Celery has set up its logging (``worker_ready``)."""
    settings = runtime.settings
    if settings.sweep_interval_seconds <= 0:
        return lambda: None  # no beat entry: `celery agboss sweep --loop` sweeps instead
    queues = runtime.app.amqp.queues
    name = settings.sweep_queue
    every_queue = getattr(queues, "_consume_from", None) is None  # no -Q
    if every_queue and name not in queues:  # never declared, so never excluded either
        queues.select_add(name)
    if name in queues.consume_from:
        if not every_queue:
            return lambda: None
        return lambda: logger.info(
            "celery_agboss: this worker also consumes the sweep queue %r", name
        )
    hostname = getattr(worker, "hostname", None)
    return lambda: log_event(
        SWEEP_QUEUE_NOT_CONSUMED,
        logging.WARNING,
        queue=name,
        worker=hostname,
        hint=f"this worker will not run beat's sweeps (its -Q leaves out {name!r}, or its "
        "-X names it); make sure another worker consumes it. While no sweep finishes for "
        "three intervals, the workers sweep themselves",
    )


def _beat_entry(settings: AGBossSettings) -> dict[str, Any]:
    """The beat entry that sends the sweep every interval."""
    interval = settings.sweep_interval_seconds
    return {
        "task": SWEEP_TASK_NAME,
        "schedule": interval,
        # Its own queue, so it never waits behind the backlog it rescues; a run that
        # did not start within one interval is dropped (the next one comes).
        "options": {"queue": settings.sweep_queue, "expires": interval},
    }


def _install_beat_entry(runtime: Runtime, settings: AGBossSettings) -> bool:
    """Add the sweep's beat entry to ``beat_schedule`` (none when the interval is 0);
    whether it was missing."""
    if settings.sweep_interval_seconds <= 0:
        return False
    schedule = dict(runtime.app.conf.beat_schedule or {})
    if SWEEP_BEAT_ENTRY in schedule:
        return False
    schedule[SWEEP_BEAT_ENTRY] = _beat_entry(settings)
    runtime.app.conf.beat_schedule = schedule
    return True


def _keep_beat_entry(runtime: Runtime, service: Any) -> None:
    """At ``beat_init``: a ``beat_schedule`` the application assigned after ``AGBoss(app)``
    replaced the one holding the sweep's entry; put it back, in the conf and in the
    scheduler beat already built from it, and say so once. A wrong configuration is
    left to ``signals.worker.beat_init``, which refuses to start beat."""
    try:
        settings = runtime.settings
    except ConfigurationError:
        return
    if not _install_beat_entry(runtime, settings):
        return
    scheduler = getattr(service, "scheduler", None)  # built before beat_init, without it
    if scheduler is not None:
        scheduler.update_from_dict({SWEEP_BEAT_ENTRY: _beat_entry(settings)})
    logger.warning(
        "celery_agboss: beat_schedule has no %r entry (a beat_schedule assigned after "
        "AGBoss(app) replaced it); it is added back, so this beat sends %r every %g s. "
        "Add to beat_schedule (app.conf.beat_schedule[name] = ...) rather than replace it",
        SWEEP_BEAT_ENTRY,
        SWEEP_TASK_NAME,
        settings.sweep_interval_seconds,
    )


def install(runtime: Runtime) -> None:
    """Called by ``AGBoss(app)``: the ``celery_agboss.sweep`` task and its beat entry, the
    sweep queue on the default worker, and each worker's watch on ``last_sweep_at`` (and
    its own sweeps while none finishes)."""
    app = runtime.app

    def on_configured(settings: AGBossSettings) -> None:
        _install_beat_entry(runtime, settings)

    runtime.when_configured(on_configured)

    # send_events=False: a run every interval would bury the payments on Flower's tasks
    # page. Its counts are in `sweep.finished` and the metrics; to see the runs in Flower
    # again: task_annotations = {"celery_agboss.sweep": {"send_events": True}}.
    @app.task(  # type: ignore[untyped-decorator]
        name=SWEEP_TASK_NAME, shared=False, ignore_result=True, send_events=False
    )
    def sweep(batch_size: int = DEFAULT_BATCH_SIZE) -> dict[str, Any]:
        """Re-drive and reconcile what dead workers and lost messages left behind."""
        interval = runtime.settings.sweep_interval_seconds
        return run_sweep(
            runtime, batch_size=batch_size, claim_tick=interval > 0, by="beat"
        ).summary()

    watches: list[_SweepWatch] = []
    to_say: list[Callable[[], None]] = []

    def on_celeryd_init(instance: Any = None, **_: Any) -> None:
        if getattr(instance, "app", None) is app:
            _declare_the_sweep_queue(runtime)

    def on_worker_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            to_say.append(_consume_the_sweep_queue(runtime, sender))

    def on_worker_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app or watches:
            return
        while to_say:
            to_say.pop(0)()
        watch = _SweepWatch(runtime)
        watches.append(watch)
        watch.thread.start()

    def on_worker_shutdown(**_: Any) -> None:
        for watch in watches:
            watch.stop.set()
        for watch in watches:  # a sweep of its own may be running: let it end (bounded)
            watch.thread.join(WATCH_JOIN_SECONDS)

    runtime.listen(celery_signals.celeryd_init, on_celeryd_init)
    runtime.listen(celery_signals.worker_init, on_worker_init)
    runtime.listen(celery_signals.worker_ready, on_worker_ready)
    runtime.listen(celery_signals.worker_shutdown, on_worker_shutdown)

    def on_beat_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app:
            _keep_beat_entry(runtime, sender)

    runtime.listen(celery_signals.beat_init, on_beat_init)
