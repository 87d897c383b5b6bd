"""Zombies on the README deployment (design: PS3, PS4, P1, P2, P3, P5): a pool child
frozen (SIGSTOP) past its lease, a take-over by the worker's other child (token + 1),
then the frozen child continued (SIGCONT); and pool children killed or exited at a named
fault point of a COMMIT.

Counted at the gateway, which does not deduplicate keys (a second send under one key is
a second payment), in the app's ``shop_paid_orders`` and in the store:

- s04, frozen with its charge on the wire: the take-over reconciles; the zombie, woken,
  sends and writes nothing;
- s05, frozen with the answer in hand, woken after the take-over completed: its settle
  is refused, and Celery records no FAILURE over the paid order;
- s05b / s05c, the zombie's settle of the charge / its ``mark-paid`` fenced effect
  reaches the store before the new holder's (the new holder is held at the same point):
  refused for its stale token; the new holder's write wins;
- s05d, frozen after recording its intent, before the send: the take-over finds nothing
  at the gateway and sends; the zombie, woken, checks its lease and sends nothing;
- s03b, a child SIGKILLed right after ``mark-paid`` committed: the re-run replays the
  charge and the effect;
- trap 6, ``SystemExit`` raised inside the COMMIT that settles the charge: nothing
  written, the re-run reconciles;
- a holder frozen inside its ``mark-paid`` transaction (PostgreSQL only): the server
  ends its idle session after one TTL, and the take-over goes on while it is frozen.

Each on SQLite+Redis and PostgreSQL+Redis; each sabotage run on PostgreSQL+Redis.

Speed-ups: tests/faults/scenario.py's (lease TTL 5 s, sweep every 2 s, grace 3 s, retry
delay 1 s, all README ``AGBOSS_<NAME>`` variables), and the harness hook
tests/faults/hooks/agboss_fault_hook.py on the workers' ``PYTHONPATH``
(``AGBOSS_TEST_FAULT_POINTS``), which stops, kills, exits or holds the first pool child
reaching a named fault point. s04 needs no hook: it freezes the child whose charge the
gateway holds.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from celery_agboss.core.fault_points import (
    FENCED_AFTER_COMMIT,
    FENCED_BEFORE_BEGIN,
    FENCED_BEFORE_COMMIT,
    OUTBOUND_BEFORE_SEND,
    OUTBOUND_BEFORE_SETTLE,
)
from celery_agboss.core.keys import business_key
from celery_agboss.core.protections import (
    FENCE_RECORDED_AS_FAILURE,
    FENCED_EFFECT_NOT_REPLAYED,
    FENCED_TRANSACTION_IDLE_UNBOUNDED,
    INTENT_CAS_WITHOUT_PREDICATE,
    LEASE_CHECK_IN_SEPARATE_ROUND_TRIP,
    SEND_WITHOUT_LEASE_CHECK,
)
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.deployment.gateway import key_tail
from tests.deployment.test_recovery import HELD_SECONDS, KILL_SECONDS, recovery_deadline
from tests.faults.scenario import (
    FAULT_SPEEDUPS,
    NOT_RECONCILED,
    POSTGRES_REDIS,
    SQLITE_REDIS,
    Stack,
    charges_of,
    deployed,
    looked_up,
    sabotaged,
    wait_for_a_second_payment,
    worker_and_beat,
)
from tests.support.processes import (
    ManagedProcess,
    WaitTimeout,
    process_state,
    signal_process,
    wait_until,
)

pytestmark = [pytest.mark.worker, pytest.mark.slow]


HOOKS = Path(__file__).resolve().parent / "hooks"
ORDER = 5
# The keys end the same in every deployment; they start with the store's deployment id,
# minted when the test migrates it (deployment.key_of, mark_paid_key).
KEY_TAIL = key_tail(ORDER)
BOTH = [SQLITE_REDIS, POSTGRES_REDIS]
WOKEN_SECONDS = 30.0  # a continued child's next step, on a loaded machine
TTL_SECONDS = float(FAULT_SPEEDUPS["AGBOSS_LEASE_TTL"])

Rule = dict[str, Any]


def mark_paid_key(deployment: Deployment) -> str:
    """The key of the README's ``mark-paid`` effect for ``ORDER`` in this deployment."""
    return business_key(deployment.tenant, f"order:{ORDER}", "mark-paid")


class Faults:
    """The test's side of the fault hook: the rules it puts in the workers' environment,
    the flags the first process at a point leaves, the files that release a hold."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def env(self, *rules: Rule) -> dict[str, str]:
        return {
            "PYTHONPATH": str(HOOKS),
            "AGBOSS_TEST_FAULT_DIR": str(self.directory),
            "AGBOSS_TEST_FAULT_POINTS": json.dumps(list(rules)),
        }

    def claimed(self, flag: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = json.loads((self.directory / flag).read_text())
        except FileNotFoundError:
            return None
        return found

    def wait_claimed(
        self, flag: str, worker: ManagedProcess, timeout: float, *, alive: bool = True
    ) -> dict[str, Any]:
        """Until a pool child of ``worker`` reached the point of ``flag``; what it left.
        ``alive``: the child is still there (stopped or held), not killed or exited."""
        worker.wait_until(
            lambda: self.claimed(flag) is not None, timeout, message=f"a child to reach {flag!r}"
        )
        found = self.claimed(flag)
        assert found is not None
        if alive:
            assert found["pid"] in worker.group_pids() and found["pid"] != worker.pid, found
        return found

    def release(self, name: str) -> None:
        (self.directory / name).touch()


@pytest.fixture
def faults(tmp_path: Path) -> Faults:
    return Faults(tmp_path / "faults")


def zombie_rule(point: str, **narrow: Any) -> Rule:
    """SIGSTOP the first pool child that reaches ``point`` (once across all processes)."""
    return {"point": point, "action": "stop", "flag": "zombie", **narrow}


def holder_rule(point: str, **narrow: Any) -> Rule:
    """Hold the next child at ``point`` (its lease renewed meanwhile) until ``go``."""
    return {
        "point": point,
        "action": "hold",
        "flag": "holder",
        "after": "zombie",
        "release": "go",
        **narrow,
    }


def _start(
    deploy: DeployFactory, stack: Stack, environment: Mapping[str, str]
) -> tuple[Deployment, ManagedProcess]:
    deployment = deployed(deploy, stack, environment)
    return deployment, worker_and_beat(deployment)


def _is_stopped(pid: int) -> bool:
    state = process_state(pid)
    if state is None:
        raise AssertionError(f"pid {pid} exited before it could be seen stopped")
    return state == "T"


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """Until the block ends, ``pid`` is stopped; it is always continued after."""
    try:
        wait_until(lambda: _is_stopped(pid), KILL_SECONDS, message=f"pid {pid} to stop")
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _fenced_line(task_id: str, token: int = 1) -> str:
    return f"execution.fenced execution_id={task_id} task=shop.charge_order token={token}"


def _wait_fenced(worker: ManagedProcess, task_id: str) -> None:
    """Until the woken zombie (token 1) ended its delivery as fenced."""
    worker.wait_until(
        lambda: _fenced_line(task_id) in worker.output(),
        WOKEN_SECONDS,
        message=f"the zombie of {task_id} to be fenced",
    )


def _failure_lines(worker: ManagedProcess, task_id: str) -> list[str]:
    """Celery's own record of a failure of the task (what monitoring pages on)."""
    mark = f"shop.charge_order[{task_id}] raised unexpected"
    return [line for line in worker.output().splitlines() if mark in line]


def _publish(deployment: Deployment) -> tuple[dict[int, str], str]:
    ids = deployment.publish([ORDER])
    return ids, ids[ORDER]


def _reach(
    deploy: DeployFactory, stack: Stack, faults: Faults, rule: Rule, extra: Mapping[str, str]
) -> tuple[Deployment, ManagedProcess, dict[int, str], int]:
    """Deploy with ``rule`` armed (and ``extra``), publish the order, and wait until a
    pool child reached the rule's point (stopped or held there, or gone when the rule
    kills or exits it). The deployment, its worker, the task ids, the child's pid."""
    deployment, worker = _start(deploy, stack, {**faults.env(rule), **extra})
    ids, _ = _publish(deployment)
    alive = rule["action"] in ("stop", "hold")
    reached = faults.wait_claimed(rule["flag"], worker, HELD_SECONDS, alive=alive)
    return deployment, worker, ids, int(reached["pid"])


# --- s04: the lease expires while the charge is on the wire ---------------------------


def freeze_the_child_on_the_wire(deployment: Deployment) -> tuple[dict[int, str], int]:
    """The gateway charges and holds its answer; the child that sent it is SIGSTOPped,
    then the hold is released (the answer waits in the frozen child's socket)."""
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge")
    ids, _ = _publish(deployment)
    hold.wait_reached(timeout=HELD_SECONDS)
    child = deployment.gateway.pid_of_charge(deployment.key_of(ORDER))
    signal_process(child, signal.SIGSTOP)
    wait_until(lambda: _is_stopped(child), KILL_SECONDS, message=f"pid {child} to stop")
    hold.release()
    return ids, child


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_s04_a_child_frozen_mid_charge_past_its_lease_is_taken_over_and_pays_once(
    stack: Stack, deploy: DeployFactory
) -> None:
    """Frozen with its charge on the wire, past the 5 s lease: the sweep re-drives the
    execution, the other child takes it over (token 2) and looks the charge up instead
    of sending it. Woken, the zombie reads its answer and tries to settle: fenced,
    nothing sent, nothing written. One payment, one request, one row."""
    deployment, worker = _start(deploy, stack, {})
    ids, child = freeze_the_child_on_the_wire(deployment)
    task_id = ids[ORDER]
    with frozen(child):
        deployment.wait_settled(ids, recovery_deadline())
        before = deployment.execution(task_id)
    _wait_fenced(worker, task_id)
    deployment.assert_each_paid_once(ids)
    assert looked_up(deployment, ORDER)
    after = deployment.execution(task_id)
    assert before is not None and after is not None
    assert (after.state, after.result) == (before.state, before.result), "the zombie wrote"
    assert _failure_lines(worker, task_id) == []


def test_s04_sabotaged_a_take_over_without_reconcile_pays_the_frozen_childs_order_twice(
    sabotage_stack: Stack, deploy: DeployFactory
) -> None:
    deployment, _ = _start(deploy, sabotage_stack, NOT_RECONCILED)
    ids, child = freeze_the_child_on_the_wire(deployment)
    with frozen(child):
        wait_until(
            lambda: charges_of(deployment, ORDER)[0] >= 2,
            recovery_deadline(),
            message=lambda: f"the second payment\n{deployment.progress(ids)}",
        )
    assert charges_of(deployment, ORDER) == (2, 2)


# --- s05: the zombie's settle, after the take-over finished ----------------------------


SETTLE_ZOMBIE = zombie_rule(OUTBOUND_BEFORE_SETTLE, match_end={"key": KEY_TAIL})


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_s05_a_zombie_settling_after_the_take_over_is_refused_and_records_no_failure(
    stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """Frozen with the gateway's answer in hand, right before settling it; the take-over
    reconciles the charge and completes the execution. Woken, the zombie's settle is
    refused (fenced): it writes nothing, and Celery records no FAILURE over the paid
    order (``Ignore`` + ``task-fenced``)."""
    deployment, worker, ids, zombie = _reach(deploy, stack, faults, SETTLE_ZOMBIE, {})
    task_id = ids[ORDER]
    with frozen(zombie):
        deployment.wait_settled(ids, recovery_deadline())
        before = deployment.execution(task_id)
    _wait_fenced(worker, task_id)
    worker.wait_for_output(f"shop.charge_order[{task_id}] ignored", WOKEN_SECONDS)
    deployment.assert_each_paid_once(ids)
    after = deployment.execution(task_id)
    assert before is not None and after is not None
    assert (after.state, after.result, after.error) == (before.state, before.result, None)
    assert _failure_lines(worker, task_id) == []


def test_s05_sabotaged_a_fenced_zombie_recorded_as_failed_marks_a_paid_order_failed(
    sabotage_stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """The fence recorded as a failure: Celery logs (and sends ``task-failed`` for) a
    FAILURE of the order the gateway charged once."""
    environment = sabotaged(FENCE_RECORDED_AS_FAILURE)
    deployment, worker, ids, zombie = _reach(
        deploy, sabotage_stack, faults, SETTLE_ZOMBIE, environment
    )
    with frozen(zombie):
        deployment.wait_settled(ids, recovery_deadline())
    worker.wait_until(
        lambda: _failure_lines(worker, ids[ORDER]),
        WOKEN_SECONDS,
        message="Celery to record the zombie's FAILURE",
    )
    assert charges_of(deployment, ORDER) == (1, 1)


# --- s05b / s05c: the zombie's write reaches the store first ---------------------------


def zombie_first(
    deployment: Deployment, worker: ManagedProcess, faults: Faults
) -> tuple[dict[int, str], dict[str, Any]]:
    """The zombie stopped right before its transaction; the new holder held at the same
    point of its own run; the zombie continued first, and its delivery ended. Returns the
    task ids and what the held holder left (its lease token)."""
    ids, _ = _publish(deployment)
    zombie = faults.wait_claimed("zombie", worker, HELD_SECONDS)
    with frozen(int(zombie["pid"])):
        holder = faults.wait_claimed("holder", worker, recovery_deadline())
    _wait_fenced(worker, ids[ORDER])
    return ids, holder


def settle_race(faults: Faults) -> dict[str, str]:
    """The zombie's settle of its charge against the take-over's settle of the same
    charge: the sweep's reconcile, which takes a stranded intent under its own lease and
    settles what the lookup found (both right before their transactions begin)."""
    return faults.env(
        zombie_rule(FENCED_BEFORE_BEGIN, within="settle_result"),
        holder_rule(FENCED_BEFORE_BEGIN, within="_settle_stranded"),
    )


def _settled_by(deployment: Deployment, holder: str) -> list[str]:
    """The events of the charge's intent that ``holder`` wrote to settle it."""
    return [
        row.event
        for row in deployment.store.read_history(deployment.key_of(ORDER))
        if row.to_status == "COMPLETED" and row.holder == holder
    ]


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_s05b_a_zombie_settling_the_charge_first_is_refused_and_the_take_over_settles_it(
    stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """The zombie's settle reaches the store first, after the sweep took the stranded
    intent over and looked the charge up (its settle held): the zombie's transaction
    checks the lease as its first statement and commits nothing; the take-over's settle,
    released after, is the one that counts. One payment, one row."""
    deployment, worker = _start(deploy, stack, settle_race(faults))
    ids, _ = zombie_first(deployment, worker, faults)
    zombie = faults.claimed("zombie")
    assert zombie is not None
    assert _settled_by(deployment, zombie["context"]["holder"]) == [], "the zombie settled"
    faults.release("go")
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    assert _settled_by(deployment, zombie["context"]["holder"]) == []


def test_s05b_sabotaged_a_lease_checked_apart_from_the_write_lets_the_zombies_settle_in(
    sabotage_stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """PS4's wrong store (the lease read in its own round trip), with the settle's
    compare-and-set predicate off too (alone, that predicate, on the owner, refuses the
    zombie's settle): the zombie's stale-token settle commits over the take-over's. The
    money is still safe: the one payment under the key is what both settle with."""
    environment = {
        **settle_race(faults),
        **sabotaged(LEASE_CHECK_IN_SEPARATE_ROUND_TRIP, INTENT_CAS_WITHOUT_PREDICATE),
    }
    deployment, worker = _start(deploy, sabotage_stack, environment)
    zombie_first(deployment, worker, faults)
    zombie = faults.claimed("zombie")
    assert zombie is not None
    assert _settled_by(deployment, zombie["context"]["holder"]) == ["completed"], (
        "the zombie's settle went in"
    )
    faults.release("go")
    assert charges_of(deployment, ORDER) == (1, 1)


def payment_race(faults: Faults) -> dict[str, str]:
    """The zombie's ``mark-paid`` against the new holder's (before their transactions)."""
    return faults.env(
        zombie_rule(FENCED_BEFORE_BEGIN, effect="mark-paid"),
        holder_rule(FENCED_BEFORE_BEGIN, effect="mark-paid"),
    )


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_s05c_a_zombie_marking_the_order_paid_first_is_refused_and_the_new_holder_writes(
    stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """The zombie's fenced effect reaches the store first, after the take-over: refused
    before its ``mark_paid`` runs (no row, no record); the new holder's, released after,
    writes the row and the record under token 2. One payment, one row."""
    deployment, worker = _start(deploy, stack, payment_race(faults))
    ids, holder = zombie_first(deployment, worker, faults)
    assert holder["context"]["token"] == 2
    assert deployment.paid_rows() == {}, "the zombie's mark_paid went in"
    assert deployment.store.read_effect(mark_paid_key(deployment)) is None
    faults.release("go")
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    effect = deployment.store.read_effect(mark_paid_key(deployment))
    assert effect is not None and effect.token == 2


def test_s05c_sabotaged_a_lease_checked_apart_from_the_write_lets_the_zombie_mark_it_paid(
    sabotage_stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """PS4's wrong store: the zombie's ``mark_paid`` and its record commit under the
    stale token, and the new holder replays them. The row names the one payment, so the
    README's effect hides the harm; an effect whose result depends on its run would not."""
    environment = {**payment_race(faults), **sabotaged(LEASE_CHECK_IN_SEPARATE_ROUND_TRIP)}
    deployment, worker = _start(deploy, sabotage_stack, environment)
    ids, _ = zombie_first(deployment, worker, faults)
    effect = deployment.store.read_effect(mark_paid_key(deployment))
    assert effect is not None and effect.token == 1, "the zombie's write went in"
    assert deployment.paid_rows() != {}
    faults.release("go")
    deployment.wait_settled(ids, recovery_deadline())
    assert charges_of(deployment, ORDER) == (1, 1)


# --- s05d: recorded, frozen before the send ---------------------------------------------

SEND_ZOMBIE = zombie_rule(OUTBOUND_BEFORE_SEND, match={"attempt": 1}, match_end={"key": KEY_TAIL})


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_s05d_a_zombie_frozen_before_its_send_checks_its_lease_and_sends_nothing(
    stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """Its intent recorded (PENDING), frozen before the send: the take-over reconciles
    (nothing at the gateway) and sends attempt 2 under the same key. Woken, the zombie
    checks its lease before sending: nothing sent. One request under the key."""
    deployment, worker, ids, zombie = _reach(deploy, stack, faults, SEND_ZOMBIE, {})
    with frozen(zombie):
        deployment.wait_settled(ids, recovery_deadline())
    _wait_fenced(worker, ids[ORDER])
    deployment.assert_each_paid_once(ids)
    assert looked_up(deployment, ORDER)


def test_s05d_sabotaged_a_send_without_a_lease_check_pays_the_order_twice(
    sabotage_stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    environment = sabotaged(SEND_WITHOUT_LEASE_CHECK)
    deployment, _, ids, zombie = _reach(deploy, sabotage_stack, faults, SEND_ZOMBIE, environment)
    with frozen(zombie):
        deployment.wait_settled(ids, recovery_deadline())
    wait_until(
        lambda: charges_of(deployment, ORDER)[0] >= 2,
        WOKEN_SECONDS,
        message=lambda: f"the zombie's payment\n{deployment.progress(ids)}",
    )
    assert charges_of(deployment, ORDER) == (2, 2)


# --- s03b: killed right after the payment's fenced effect committed ---------------------

KILL_AFTER_MARK_PAID = {
    "point": FENCED_AFTER_COMMIT,
    "action": "kill",
    "flag": "killed",
    "effect": "mark-paid",
}


def kill_after_mark_paid(
    deploy: DeployFactory, stack: Stack, faults: Faults, extra: Mapping[str, str]
) -> tuple[Deployment, dict[int, str]]:
    deployment, worker, ids, killed = _reach(deploy, stack, faults, KILL_AFTER_MARK_PAID, extra)
    wait_until(lambda: killed not in worker.group_pids(), KILL_SECONDS, message="the kill")
    return deployment, ids


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_s03b_a_child_killed_after_mark_paid_committed_is_replayed_from_the_store(
    stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """SIGKILLed after the effect's COMMIT, before the execution completed: the sweep
    re-drives it and the re-run replays the charge and ``mark-paid`` from the store (the
    record is the killed child's, token 1): one payment, one row, COMPLETED."""
    deployment, ids = kill_after_mark_paid(deploy, stack, faults, {})
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    effect = deployment.store.read_effect(mark_paid_key(deployment))
    assert effect is not None and effect.token == 1, "the re-run wrote the effect again"
    assert not deployment.gateway.gateway.lookups, "a completed charge needs no lookup"


def test_s03b_sabotaged_a_fenced_effect_run_again_marks_a_paid_order_failed(
    sabotage_stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """The recorded effect not replayed: the re-run's ``mark_paid`` inserts the order's
    row again, the app's own primary key refuses it, and the execution ends FAILED with
    the order paid."""
    deployment, ids = kill_after_mark_paid(
        deploy, sabotage_stack, faults, sabotaged(FENCED_EFFECT_NOT_REPLAYED)
    )
    task_id = ids[ORDER]
    wait_until(
        lambda: deployment.states([task_id])[task_id] == "FAILED",
        recovery_deadline(),
        message=lambda: f"the paid order to be recorded failed\n{deployment.progress(ids)}",
    )
    assert charges_of(deployment, ORDER) == (1, 1)
    assert len(deployment.paid_rows()) == 1


# --- SystemExit inside the COMMIT that settles the charge (design: trap 6) --------------

EXIT_IN_SETTLE_COMMIT = {
    "point": FENCED_BEFORE_COMMIT,
    "action": "exit",
    "flag": "exited",
    "within": "settle_result",
}


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_trap6_a_system_exit_inside_the_settle_commit_writes_nothing_and_pays_once(
    stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """Cold shutdown's ``SystemExit`` raised in a child inside the COMMIT of the charge's
    settle (the gateway charged): the transaction rolls back whole (the intent stays
    PENDING, no half-settled row), the child ends, and the re-run reconciles the charge
    instead of sending it. One payment, one row, COMPLETED."""
    deployment, _, ids, _ = _reach(deploy, stack, faults, EXIT_IN_SETTLE_COMMIT, {})
    deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    assert looked_up(deployment, ORDER)


def test_trap6_sabotaged_a_resend_without_reconcile_after_the_exit_pays_twice(
    sabotage_stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    deployment, _, ids, _ = _reach(
        deploy, sabotage_stack, faults, EXIT_IN_SETTLE_COMMIT, NOT_RECONCILED
    )
    wait_for_a_second_payment(deployment, ORDER, ids)


# --- a holder frozen inside its fenced transaction (PostgreSQL) -------------------------

FROZEN_IN_MARK_PAID = zombie_rule(FENCED_BEFORE_COMMIT, effect="mark-paid")
STALLED_SECONDS = 3 * TTL_SECONDS
"""How long the twin watches a frozen holder's execution not being taken over: three
TTLs, where the protected run is taken over after about two."""


def freeze_inside_mark_paid(
    deploy: DeployFactory, stack: Stack, faults: Faults, extra: Mapping[str, str]
) -> tuple[Deployment, ManagedProcess, dict[int, str], int]:
    """The child stops inside ``mark-paid``'s transaction, right before its COMMIT: the
    charge is settled, the app's row written but not committed, and the transaction
    holds the lock on the execution's lease row."""
    return _reach(deploy, stack, faults, FROZEN_IN_MARK_PAID, extra)


def _taken_over(deployment: Deployment, task_id: str) -> bool:
    record = deployment.execution(task_id)
    return record is not None and record.recovery_count >= 1


@pytest.mark.parametrize("stack", [POSTGRES_REDIS], indirect=True)
def test_s05_a_holder_frozen_inside_its_transaction_is_cut_off_and_the_order_paid_once(
    stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """PostgreSQL ends a session idle in a fenced transaction for one TTL (its commit
    would be refused: the lease expired meanwhile), so the lease row's lock goes with
    it. While the zombie is still frozen, the other child takes the execution over,
    replays the charge and writes the row under token 2; woken, the zombie's COMMIT
    finds its session gone. One payment, one row. PostgreSQL only: on SQLite a frozen
    process holding the store's one write lock stops every writer until it is woken
    (docs/operators.md)."""
    deployment, worker, ids, zombie = freeze_inside_mark_paid(deploy, stack, faults, {})
    with frozen(zombie):
        deployment.wait_settled(ids, recovery_deadline())
    deployment.assert_each_paid_once(ids)
    effect = deployment.store.read_effect(mark_paid_key(deployment))
    assert effect is not None and effect.token == 2, effect
    ended = f"execution.store-failed error=StoreUnavailableError execution_id={ids[ORDER]}"
    worker.wait_until(
        lambda: ended in worker.output(),
        WOKEN_SECONDS,
        message="the woken zombie to find its session ended",
    )
    deployment.assert_each_paid_once(ids)


def test_s05_sabotaged_a_frozen_holders_open_transaction_stalls_its_payment(
    sabotage_stack: Stack, deploy: DeployFactory, faults: Faults
) -> None:
    """Without the idle bound the frozen session keeps the lease row locked: no worker
    can decide on the lease, and the paid order waits for as long as the process stays
    frozen (here, three TTLs: not taken over, not marked paid)."""
    environment = sabotaged(FENCED_TRANSACTION_IDLE_UNBOUNDED)
    deployment, _, ids, zombie = freeze_inside_mark_paid(
        deploy, sabotage_stack, faults, environment
    )
    task_id = ids[ORDER]
    with frozen(zombie):
        with pytest.raises(WaitTimeout):
            wait_until(lambda: _taken_over(deployment, task_id), STALLED_SECONDS, interval=0.5)
        assert deployment.paid_rows() == {}
    assert charges_of(deployment, ORDER) == (1, 1)
