"""The sweep makes progress past rows it cannot act on yet (design: sweep), on SQLite and
PostgreSQL: a row a step lists and then leaves as it was keeps its place at the head of
every batch, so each step lists only rows it writes something for, and an intent it
could not look up backs off like a failed lookup. A slow gateway holds back the
reconcile step for one interval at most, never the steps after it; and a worker
started with ``-X`` naming the sweep queue does not consume it.

Time moves on the virtual database clock, at the sweep's own pace (an interval per run)
unless said otherwise; ``sweep_sending_nothing`` proves no run sends money (design: P3).
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import signals
from celery.worker import WorkController

from celery_agboss import Completed, NotSent, OutboundCall, Unknown
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.fault_points import RECONCILE_AFTER_LOOKUP
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.outbound import CallContext, Lookup
from celery_agboss.core.store_protocol import IntentRecord, IntentStatus
from celery_agboss.errors import OutboundCallOutcomeUnknownError
from celery_agboss.store.migrate import migrate
from celery_agboss.sweep.steps import SweepReport, SweepRun
from celery_agboss.testing.fault_arming import arm_raise, disarm_all
from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.conftest import ProcessFactory
from tests.operations.cli import QUIET_WORKER, REPO_ROOT, ops_app_command, ops_app_env
from tests.operations.conftest import WorldFactory
from tests.operations.world import GRACE_SECONDS, INTERVAL_SECONDS, TTL_SECONDS, World

SWEEP_QUEUE = "agboss.sweep"
HOUR = 3600


def _a_call(
    world: World, kind: str, reconcile: Callable[[CallContext, Lookup], Any]
) -> OutboundCall:
    """A call of a name of its own, charging at ``world``'s gateway; not registered."""
    return OutboundCall(
        name=f"ops.{kind}_{uuid.uuid4().hex[:6]}",
        send=lambda c: world.gateway.charge(c.request["amount"], c.idempotency_key),
        reconcile=reconcile,
        key_retention=timedelta(hours=24),
    )


def _charge_with(world: World, call: OutboundCall, execution_id: str) -> None:
    """A delivery starts ``execution_id`` and charges through ``call``; the gateway takes
    the money and its answer is lost: the intent stays PENDING (the holder dies later)."""
    ctx = world.start(execution_id)
    world.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with pytest.raises(OutboundCallOutcomeUnknownError):
        ctx.outbound(call, {"amount": 1000, "order": execution_id})


def _charged_through(world: World, call: OutboundCall, count: int) -> list[str]:
    """``count`` executions published and charged through ``call`` (``_charge_with``)."""
    charged: list[str] = []
    for _ in range(count):
        charged.append(world.publish())
        _charge_with(world, call, charged[-1])
    return charged


def _intent(world: World, execution_id: str) -> IntentRecord:
    (intent,) = world.intents(execution_id)
    return intent


def _last_history(world: World, intent: IntentRecord) -> tuple[str, Any]:
    """The event and ``reason`` of the intent's last history row."""
    last = world.agboss.store.read_history(intent.idempotency_key)[-1]
    assert isinstance(last.detail, dict)
    return last.event, last.detail.get("reason")


def _behind_them(world: World) -> tuple[str, str]:
    """What the rows at the head of the listings must not hide: once the deliveries
    before died and their leases expired, a delivery that dies holding nothing (for the
    re-drive) and one revoked while it runs, with nothing sent (for the cancel step)."""
    world.die()
    world.clock.advance(5)
    dead = world.publish()
    world.start(dead)
    revoked = world.publish()
    world.start(revoked)
    world.agboss.executions.request_cancel(revoked, "revoked, nothing sent")
    return dead, revoked


def _sweeps(world: World, runs: int, *, advance: float = INTERVAL_SECONDS + 1) -> list[SweepReport]:
    """``runs`` sweeps with batches of two, the clock moving ``advance`` s after each."""
    reports = []
    for _ in range(runs):
        reports.append(world.sweep_sending_nothing(batch_size=2))
        world.clock.advance(advance)
    return reports


# --- rows a step cannot act on yet never hold back the others ------------------------


def test_cancel_requested_rows_whose_lookups_keep_failing_never_hold_back_the_others(
    world_factory: WorldFactory,
) -> None:
    """Two revoked orders whose charges cannot be looked up (the lookup API is down)
    stand first in the re-drive and cancel listings. The cancel step can do nothing for
    them until a lookup succeeds, and a re-drive could send: neither lists them, so a dead
    delivery, a lost message and a revoked execution behind them are handled, with
    batches of two. Once the lookups answer, the charged orders end waiting for an
    operator (cancelled after a completed payment)."""
    world = world_factory()
    lookups_down = True

    def reconcile(call: CallContext, lookup: Lookup) -> Any:
        if lookups_down:
            raise ConnectionError("lookup API down")
        found = world.gateway.lookup(call.idempotency_key)
        return NotSent() if found is None else Completed(found)

    flaky = _a_call(world, "flaky", reconcile)
    world.agboss.register(flaky)
    stuck = _charged_through(world, flaky, 2)
    for execution_id in stuck:
        world.agboss.executions.request_cancel(execution_id, "revoked")
    dead, revoked = _behind_them(world)
    lost = world.publish()
    world.die()
    world.clock.advance(GRACE_SECONDS + 1)

    reports = _sweeps(world, 3, advance=HOUR + 1)

    assert world.publishes_of(dead) >= 2, "the dead delivery is re-driven"
    assert world.publishes_of(lost) >= 2, "the lost message is re-published"
    assert world.execution(revoked).state is ExecutionState.CANCELLED
    assert sum(r.cancelled for r in reports) == 1
    for execution_id in stuck:
        assert world.publishes_of(execution_id) == 1, "a cancel-requested row is never re-driven"
        assert world.execution(execution_id).state is ExecutionState.RUNNING
        assert _intent(world, execution_id).status is IntentStatus.PENDING

    lookups_down = False
    _sweeps(world, 1)
    for execution_id in stuck:
        assert _intent(world, execution_id).status is IntentStatus.COMPLETED
        record = world.execution(execution_id)
        assert record.state is ExecutionState.WAITING_OPERATOR, record
        assert world.publishes_of(execution_id) == 1
    assert len(world.gateway.payments) == 2, "nothing was charged twice"


def test_parked_cancel_requests_waiting_on_an_operator_never_hold_back_the_cancel_step(
    world_factory: WorldFactory,
) -> None:
    """A ``PARKED`` execution whose intent waits for an operator, then revoked: the cancel
    step can neither end it (a payment may exist) nor move it (only an operator does), so
    it is not listed, and a revoked execution behind it is cancelled."""
    world = world_factory(lookup="none")  # every lookup answers Unknown
    parked = []
    for _ in range(2):
        parked.append(world.publish())
        world.strand(parked[-1])
    assert world.sweep_sending_nothing().unreconciled == 2
    for execution_id in parked:
        moved = world.agboss.executions.move(
            execution_id,
            [ExecutionState.WAITING_OPERATOR],
            ExecutionState.PARKED,
            "past the recovery cap",
        )
        assert moved is not None
        world.agboss.executions.request_cancel(execution_id, "revoked")
    world.clock.advance(5)
    revoked = world.publish()
    world.start(revoked)
    world.agboss.executions.request_cancel(revoked, "revoked, nothing sent")
    world.die()

    assert sum(r.cancelled for r in _sweeps(world, 2)) == 1
    assert world.execution(revoked).state is ExecutionState.CANCELLED
    for execution_id in parked:
        assert world.execution(execution_id).state is ExecutionState.PARKED
        assert _intent(world, execution_id).needs_operator


def test_cancel_requested_rows_whose_cancel_step_raises_go_last_and_never_hold_back_the_others(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two revoked executions on which the cancel step raises every run (say their intent
    was sealed under a key no longer configured) stand first in its oldest-first listing;
    each failure puts the row last, so a revoked execution behind them is cancelled, with
    batches of two, and the two are tried again later."""
    poisoned = []
    for _ in range(2):
        poisoned.append(world.publish())
        world.start(poisoned[-1])
        world.agboss.executions.request_cancel(poisoned[-1], "revoked")
    _, revoked = _behind_them(world)
    original = SweepRun._cancel_one
    tried: list[str] = []

    def cancel_one(run: SweepRun, execution_id: str) -> None:
        tried.append(execution_id)
        if execution_id in poisoned:
            raise RuntimeError("an intent no configured key opens")
        original(run, execution_id)

    monkeypatch.setattr(SweepRun, "_cancel_one", cancel_one)
    world.clock.advance(TTL_SECONDS + 1)

    reports = _sweeps(world, 3)

    assert world.execution(revoked).state is ExecutionState.CANCELLED
    assert sum(r.cancelled for r in reports) == 1
    assert tried.count(poisoned[0]) >= 2, "a row that raised is tried again later"
    for execution_id in poisoned:
        assert world.execution(execution_id).cancel_requested


# --- stranded intents this sweeper cannot look up back off ---------------------------


def test_intents_of_a_call_the_sweeper_cannot_name_back_off_and_never_hide_a_charged_order(
    world_factory: WorldFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Two stranded intents of a call the sweeping app cannot resolve (declared twice in
    the process, registered by another app only) are listed first, oldest first. They
    back off like a failed lookup, counted as errors and logged with the call's name and
    what to do, so the charged, revoked order behind them is looked up: its payment is
    found, and it waits for an operator as money to refund."""
    sweeper = world_factory()
    other = world_factory()  # the same store: a worker that knows the call

    def never_asked(call: CallContext, lookup: Lookup) -> Any:
        return Unknown("this process was not meant to look it up")

    known = _a_call(other, "orphan", never_asked)
    twin = OutboundCall(  # a second declaration of the name: `sweeper` cannot pick one
        name=known.name,
        send=lambda c: other.gateway.charge(c.request["amount"], c.idempotency_key),
        reconcile=never_asked,
        key_retention=timedelta(hours=24),
    )
    other.agboss.register(known)
    orphans = _charged_through(other, known, 2)
    other.die()
    victim = sweeper.publish()
    _charge_with(sweeper, sweeper.call, victim)
    sweeper.agboss.executions.request_cancel(victim, "revoked")
    sweeper.die()

    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        reports = _sweeps(sweeper, 2)

    intent = _intent(sweeper, victim)
    assert intent.status is IntentStatus.COMPLETED, "the victim's charge is looked up"
    record = sweeper.execution(victim)
    assert record.state is ExecutionState.WAITING_OPERATOR, record
    assert "completed payment" in (record.reason or "")
    # Counted where an operator looks, then backing off (30 s doubling) in the next run.
    assert [(r.unknown_calls, r.errors) for r in reports] == [(2, 2), (0, 0)], reports
    for execution_id in orphans:
        orphan = _intent(sweeper, execution_id)
        assert orphan.status is IntentStatus.PENDING
        assert orphan.lookup_failures == 1 and orphan.next_lookup_at_ms is not None
        assert _last_history(sweeper, orphan) == (HistoryEvent.LOOKUP_FAILED.value, "unknown-call")
    said = [
        r
        for r in caplog.records
        if getattr(r, "reason", None) == "unknown-call" and getattr(r, "call", None) == known.name
    ]
    assert len(said) == 2 and all(r.levelno == logging.WARNING for r in said)
    assert "import the module that declares the call" in said[0].getMessage()
    del twin


def test_intents_whose_reconcile_raises_in_the_sweep_back_off_and_never_hide_the_others(
    world_factory: WorldFactory,
) -> None:
    """The sweep's reconcile of two intents raises after their lookup (not the lookup
    itself: that is a failed lookup already). Each is counted as an error and backed off,
    handed back by the sweeper, so the revoked order behind them is reconciled."""
    world = world_factory()
    breaking = _a_call(
        world, "breaking", lambda c, lookup: Completed(world.gateway.lookup(c.idempotency_key))
    )
    world.agboss.register(breaking)
    broken = _charged_through(world, breaking, 2)
    victim = world.publish()
    _charge_with(world, world.call, victim)
    world.agboss.executions.request_cancel(victim, "revoked")
    world.die()
    arm_raise(RECONCILE_AFTER_LOOKUP, times=100, only={"call": breaking.name})
    try:
        reports = _sweeps(world, 2)
    finally:
        disarm_all()

    assert _intent(world, victim).status is IntentStatus.COMPLETED
    assert world.execution(victim).state is ExecutionState.WAITING_OPERATOR
    assert [r.errors for r in reports] == [2, 0], reports  # then backing off
    for execution_id in broken:
        intent = _intent(world, execution_id)
        assert intent.status is IntentStatus.PENDING
        assert intent.owner is None, "handed back by the sweeper"
        assert intent.lookup_failures == 1 and intent.next_lookup_at_ms is not None
        assert _last_history(world, intent) == (HistoryEvent.LOOKUP_FAILED.value, "sweep-error")


# --- a slow gateway holds back the reconcile step only -------------------------------

_LOOKUP_TIMEOUT = 0.5
"""The attempt timeout of the slow-gateway test: each hanging lookup gives up this soon."""


def test_lookups_that_hang_hold_back_the_reconcile_step_for_one_interval_only(
    world_factory: WorldFactory,
) -> None:
    """Three stranded intents whose lookups hang until their attempt timeout; the
    interval (the reconcile step's budget) is shorter than one lookup. Each run makes one
    lookup, leaves the others to the next run, and still re-drives the dead delivery and
    cancels the revoked execution; the next runs reach the other intents (the first is
    backing off)."""
    world = world_factory(attempt_timeout=_LOOKUP_TIMEOUT)
    released = threading.Event()

    def hanging(call: CallContext, lookup: Lookup) -> Any:
        released.wait(30)  # ended by the test (or its bound): never a fixed sleep
        raise ConnectionError("the lookup hung")

    slow = _a_call(world, "slow", hanging)
    world.agboss.register(slow)
    stranded = _charged_through(world, slow, 3)
    dead, revoked = _behind_them(world)
    world.die()
    try:
        first = world.sweep_sending_nothing(interval_seconds=_LOOKUP_TIMEOUT / 5)
        assert first.lookup_failed == 1, first
        assert first.lookups_deferred == 2, first
        assert world.publishes_of(dead) == 2, "re-driven in the same run"
        assert world.execution(revoked).state is ExecutionState.CANCELLED
        later = [
            world.sweep_sending_nothing(interval_seconds=_LOOKUP_TIMEOUT / 5) for _ in range(2)
        ]
    finally:
        released.set()
    assert [r.lookup_failed for r in later] == [1, 1], later
    assert [_intent(world, e).lookup_failures for e in stranded] == [1, 1, 1]


# --- a worker started with -X naming the sweep queue ---------------------------------


class _Worker:
    """What Celery's signals hand the handlers: the worker (its app and name)."""

    def __init__(self, world: World) -> None:
        self.app = world.app
        self.hostname = "w1@test"


@contextmanager
def _a_cli_worker(
    world: World, include: list[str] | None, exclude: list[str] | None
) -> Iterator[None]:
    """A worker as ``celery worker [-Q include] [-X exclude]`` makes it: ``celeryd_init``,
    then Celery's own ``setup_queues``, then ``worker_init`` and ``worker_ready``."""
    worker = _Worker(world)
    options = {"queues": include, "exclude_queues": exclude}
    signals.celeryd_init.send(
        sender=worker.hostname, instance=worker, conf=world.app.conf, options=options
    )
    WorkController.setup_queues(worker, include, exclude)  # Celery's own -Q and -X
    signals.worker_init.send(sender=worker)
    signals.worker_ready.send(sender=worker)
    try:
        yield
    finally:
        signals.worker_shutdown.send(sender=None)


_WORKERS = [
    # (-Q, -X, consumes the sweep queue): -X naming it first, the case that was wrong
    (None, [SWEEP_QUEUE], False),
    (None, None, True),
    (None, ["some-other-queue"], True),
    (["ops"], None, False),
    (["ops", SWEEP_QUEUE], None, True),
]


def test_only_a_worker_given_neither_q_nor_an_x_naming_it_adds_the_sweep_queue(
    world_factory: WorldFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Celery applies ``-X`` only to queues it knows, and keeps no other record of it:
    the sweep queue, declared before, is left out by ``-X agboss.sweep`` like any other,
    and the worker says so once. Each worker on an app of its own (Celery's queues are
    the app's)."""
    for include, exclude, consumed in _WORKERS:
        world = world_factory()
        queues = world.app.amqp.queues
        caplog.clear()
        with (
            caplog.at_level(logging.WARNING, logger="celery_agboss"),
            _a_cli_worker(world, include, exclude),
        ):
            case = f"-Q {include} -X {exclude}"
            assert (SWEEP_QUEUE in queues.consume_from) is consumed, case
            assert ("ops" in queues.consume_from) is (include is None or "ops" in include), case
        warned = [r for r in caplog.records if "sweep.queue-not-consumed" in r.getMessage()]
        assert len(warned) == (0 if consumed else 1), case


_BANNER_QUEUE = re.compile(r"^\s*\.> (\S+)", re.MULTILINE)


@pytest.mark.worker
@pytest.mark.sqlite
def test_a_celery_worker_started_with_x_naming_the_sweep_queue_does_not_consume_it(
    managed_process: ProcessFactory, tmp_path: Path
) -> None:
    """The real thing: ``celery worker -X agboss.sweep`` lists only its task queue in its
    banner and says once that it leaves the sweep queue to others."""
    url = f"sqlite:///{(tmp_path / 'agboss.db').resolve()}"
    migrate(url)
    worker = managed_process(
        ops_app_command(
            "worker",
            "-X",
            SWEEP_QUEUE,
            "-P",
            "solo",
            *QUIET_WORKER,
            "-n",
            f"x-{uuid.uuid4().hex[:6]}@%h",
        ),
        name="worker-x-sweep",
        env=ops_app_env({"database_url": url, "broker_url": "memory://"}),
        cwd=str(REPO_ROOT),
    )
    worker.wait_for_output("sweep.queue-not-consumed", 30)
    assert _BANNER_QUEUE.findall(worker.output()) == ["ops"], worker.tail(40)
    assert "also consumes the sweep queue" not in worker.output()
