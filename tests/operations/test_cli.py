"""``celery -A proj agboss …`` through click's CliRunner on a real app and store, and once
for real: ``celery -A <module> agboss pending`` in a subprocess.

What an operator types, what they read, and the exit codes scripts rely on.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from celery import Celery
from click.testing import Result

from celery_agboss.app import AGBoss
from celery_agboss.cli import EXIT_CONFIGURATION, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_USAGE
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.history import HistoryEvent
from celery_agboss.core.protections import OPERATOR_RESULT_UNCHECKED
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.testing.gateway_types import FakeGatewayFault
from celery_agboss.testing.switches import sabotage
from tests.operations.cli import REPO_ROOT, ops_app_command, ops_app_env, run, run_json
from tests.operations.conftest import WorldFactory
from tests.operations.world import CAP, INTERVAL_SECONDS, World


@pytest.fixture
def no_lookup(world_factory: WorldFactory) -> World:
    """A gateway without lookup: an unknown outcome waits for an operator."""
    return world_factory(lookup="none")


def _waiting_for_operator(world: World) -> tuple[str, str]:
    task_id, key = world.stranded()
    assert world.sweep().unreconciled == 1
    assert world.execution(task_id).state is ExecutionState.WAITING_OPERATOR
    return task_id, key


# --- pending and show ---------------------------------------------------------------------


def test_pending_lists_what_waits_for_an_operator_and_says_what_to_do(no_lookup: World) -> None:
    task_id, key = _waiting_for_operator(no_lookup)
    result = run(no_lookup.app, "pending")
    assert result.exit_code == 0
    assert key in result.output and task_id in result.output
    assert "NEEDS OPERATOR" in result.output
    assert "agboss resolve KEY --completed RESULT_JSON" in result.output
    data = run_json(no_lookup.app, "pending")
    assert data["needs_operator"] == 1
    assert data["pending"][0]["idempotency_key"] == key
    assert data["pending"][0]["execution_id"] == task_id


def test_pending_says_when_its_limit_hides_more(no_lookup: World) -> None:
    """A full page is not the whole list: an operator told "1 waiting" while two wait
    would resolve one and think the queue empty."""
    _waiting_for_operator(no_lookup)
    _waiting_for_operator(no_lookup)
    result = run(no_lookup.app, "pending", "--limit", "1")
    assert "1+ (--limit 1 reached; raise it to see the rest) outbound call(s)" in result.output
    assert "1+ (--limit 1 reached" in result.output.split("waiting for an operator:")[1]
    data = run_json(no_lookup.app, "pending", "--limit", "1")
    assert data["limit_reached"] == ["pending", "waiting_executions"]
    assert run_json(no_lookup.app, "pending")["limit_reached"] == []


def test_pending_says_so_when_nothing_is_pending(world: World) -> None:
    result = run(world.app, "pending")
    assert result.exit_code == 0
    assert "Nothing pending" in result.output


def test_show_an_intent_gives_its_execution_history_and_quarantine_record(
    no_lookup: World,
) -> None:
    task_id, key = _waiting_for_operator(no_lookup)
    data = run_json(no_lookup.app, "show", key)
    assert data["execution"]["id"] == task_id
    assert data["execution"]["state"] == "WAITING_OPERATOR"
    events = [row["event"] for row in data["history"][key]]
    assert events[0] == HistoryEvent.CLAIMED.value
    assert HistoryEvent.UNRECONCILED.value in events
    text = run(no_lookup.app, "show", task_id).output
    assert f"Execution {task_id}" in text and key in text


def test_show_says_a_pending_intents_status_once_then_what_it_waits_for(
    no_lookup: World,
) -> None:
    """Not ``PENDING: PENDING (…)``: the status, then the wait, each once."""
    _, key = _waiting_for_operator(no_lookup)
    text = run(no_lookup.app, "show", key).output
    call_line = next(line for line in text.splitlines() if line.strip().startswith("call:"))
    assert call_line.count("PENDING") == 1, call_line
    assert "PENDING — NEEDS OPERATOR: " in call_line, call_line


def test_show_of_an_unknown_name_exits_not_found(world: World) -> None:
    result = run(world.app, "show", "nope")
    assert result.exit_code == EXIT_NOT_FOUND
    assert "agboss pending" in result.output


# --- resolve ----------------------------------------------------------------------------


def test_resolve_completed_stores_the_result_audits_and_redrives(no_lookup: World) -> None:
    """An operator settles an unknown outcome; a person's decision is on the record (design: P4)."""
    task_id, key = _waiting_for_operator(no_lookup)
    publishes = no_lookup.publishes_of(task_id)
    receipt = {"id": "ch_manual", "status": "succeeded", "amount": 1000}
    result = run(
        no_lookup.app,
        "resolve",
        key,
        "--completed",
        json.dumps(receipt),
        "--reason",
        "seen in the dashboard",
        "--actor",
        "alice",
    )
    assert result.exit_code == 0, result.output
    assert "nothing will be sent" in result.output
    (intent,) = no_lookup.intents(task_id)
    assert intent.status is IntentStatus.COMPLETED
    assert intent.result == receipt
    assert intent.gateway_transaction_id == "ch_manual"
    assert not intent.needs_operator
    history = no_lookup.agboss.store.read_history(key)
    assert history[-1].event == HistoryEvent.RESOLVED_BY_OPERATOR.value
    (audit,) = no_lookup.agboss.executions.list_audit(key)
    assert (audit.actor, audit.action, audit.reason) == (
        "alice",
        "resolve:completed",
        "seen in the dashboard",
    )
    assert json.loads(audit.before or "")["status"] == "PENDING"
    assert json.loads(audit.after or "")["status"] == "COMPLETED"
    assert no_lookup.publishes_of(task_id) == publishes + 1
    assert no_lookup.execution(task_id).state is ExecutionState.WAITING


def test_resolve_not_sent_lets_the_next_delivery_send_it_again(no_lookup: World) -> None:
    task_id, key = _waiting_for_operator(no_lookup)
    result = run(no_lookup.app, "resolve", key, "--not-sent", "--reason", "not in the dashboard")
    assert result.exit_code == 0, result.output
    (intent,) = no_lookup.intents(task_id)
    assert intent.status is IntentStatus.FAILED
    (audit,) = no_lookup.agboss.executions.list_audit(key)
    assert audit.actor  # the OS user when --actor is not given
    assert no_lookup.execution(task_id).state is ExecutionState.WAITING


def test_resolve_is_refused_while_the_owner_lease_is_live(no_lookup: World) -> None:
    """An intent that a live delivery holds may be on its way to the gateway right now
    (design: P1)."""
    task_id = no_lookup.publish()
    ctx = no_lookup.start(task_id)
    no_lookup.gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    with pytest.raises(BaseException):  # noqa: B017 - the outcome is unknown
        ctx.outbound(
            no_lookup.call, {"amount": 1000, "order": task_id}, business_key=f"order:{task_id}"
        )
    (intent,) = no_lookup.intents(task_id)
    result = run(
        no_lookup.app, "resolve", intent.idempotency_key, "--not-sent", "--reason", "too early"
    )
    assert result.exit_code == EXIT_REFUSED
    assert "live" in result.output
    (after,) = no_lookup.intents(task_id)
    assert after.status is IntentStatus.PENDING
    assert no_lookup.agboss.executions.list_audit(intent.idempotency_key) == []


def test_resolve_needs_exactly_one_decision_and_valid_json(no_lookup: World) -> None:
    _, key = _waiting_for_operator(no_lookup)
    neither = run(no_lookup.app, "resolve", key, "--reason", "x")
    assert neither.exit_code == EXIT_USAGE
    assert "exactly one of" in neither.output
    bad = run(no_lookup.app, "resolve", key, "--completed", "{not json", "--reason", "x")
    assert bad.exit_code == EXIT_USAGE
    assert "--completed must be JSON" in bad.output
    missing = run(no_lookup.app, "resolve", "no-such-key", "--not-sent", "--reason", "x")
    assert missing.exit_code == EXIT_NOT_FOUND


def _resolve_with_a_bare_charge_id(world: World) -> tuple[str, str, Result]:
    """What an operator pastes from the dashboard: the charge id, not the receipt."""
    task_id, key = _waiting_for_operator(world)
    result = run(world.app, "resolve", key, "--completed", '"ch_123"', "--reason", "pasted")
    return task_id, key, result


def test_resolve_completed_refuses_a_result_the_call_would_not_return(
    no_lookup: World,
) -> None:
    """The next delivery replays the operator's result as if send returned it."""
    task_id, key, result = _resolve_with_a_bare_charge_id(no_lookup)
    assert result.exit_code == EXIT_REFUSED
    assert "finds no gateway id" in result.output and '{"id": "ch_...' in result.output
    (intent,) = no_lookup.intents(task_id)
    assert intent.status is IntentStatus.PENDING, "nothing written"
    assert no_lookup.agboss.executions.list_audit(key) == []


def test_storing_it_unchecked_hands_the_body_a_string_for_its_receipt(
    no_lookup: World,
) -> None:
    with sabotage(OPERATOR_RESULT_UNCHECKED):
        task_id, _, result = _resolve_with_a_bare_charge_id(no_lookup)
    assert result.exit_code == 0
    ctx = no_lookup.start(task_id)
    receipt = ctx.outbound(
        no_lookup.call, {"amount": 1000, "order": task_id}, business_key=f"order:{task_id}"
    )
    with pytest.raises(TypeError):
        receipt["id"]  # what the body does with the receipt


def test_resolve_completed_is_checked_by_the_calls_own_validator(
    world_factory: WorldFactory,
) -> None:
    def a_receipt(result: Any) -> None:
        if not isinstance(result, dict) or result.get("status") != "succeeded":
            raise ValueError("expected a receipt with status 'succeeded'")

    world = world_factory(lookup="none", validate_result=a_receipt)
    task_id, key = _waiting_for_operator(world)
    refused = run(world.app, "resolve", key, "--completed", '{"id": "ch_1"}', "--reason", "x")
    assert refused.exit_code == EXIT_REFUSED
    assert "status 'succeeded'" in refused.output
    accepted = run(
        world.app,
        "resolve",
        key,
        "--completed",
        '{"id": "ch_1", "status": "succeeded"}',
        "--reason",
        "x",
    )
    assert accepted.exit_code == 0, accepted.output
    (intent,) = world.intents(task_id)
    assert intent.status is IntentStatus.COMPLETED


def test_resolve_of_a_settled_intent_is_refused(no_lookup: World) -> None:
    _, key = _waiting_for_operator(no_lookup)
    assert run(no_lookup.app, "resolve", key, "--not-sent", "--reason", "x").exit_code == 0
    again = run_json(no_lookup.app, "resolve", key, "--not-sent", "--reason", "x")
    assert again["error"]["code"] == "wrong-state"


# --- cancel, executions, unpark ------------------------------------------------------------


def test_cancel_of_a_requested_execution_means_it_never_runs(world: World) -> None:
    task_id = world.publish()
    result = run(world.app, "cancel", task_id, "--reason", "customer asked")
    assert result.exit_code == 0, result.output
    assert "will never run" in result.output
    assert world.execution(task_id).state is ExecutionState.CANCELLED
    (audit,) = world.agboss.executions.list_audit(task_id)
    assert audit.action == "cancel" and audit.reason == "customer asked"
    world.clock.advance(3600)
    assert world.sweep().republished == 0


def test_cancel_is_refused_while_an_intent_is_pending(no_lookup: World) -> None:
    """A payment that may have been made is not cancelled behind the gateway's back."""
    task_id, key = _waiting_for_operator(no_lookup)
    result = run(no_lookup.app, "cancel", task_id, "--reason", "stop it")
    assert result.exit_code == EXIT_REFUSED
    assert key in result.output and "resolve" in result.output
    assert no_lookup.execution(task_id).state is ExecutionState.WAITING_OPERATOR


def test_accept_is_only_for_a_divergence(no_lookup: World) -> None:
    """An unknown outcome is settled by ``resolve``; ``accept`` would complete over it."""
    task_id, _ = _waiting_for_operator(no_lookup)
    result = run(no_lookup.app, "accept", task_id, "--reason", "looks fine")
    assert result.exit_code == EXIT_REFUSED
    assert "not waiting for a divergence" in result.output
    assert no_lookup.execution(task_id).state is ExecutionState.WAITING_OPERATOR
    assert no_lookup.agboss.executions.list_audit(task_id) == []


def test_cancel_is_refused_while_a_delivery_runs_it(world: World) -> None:
    task_id = world.publish()
    world.start(task_id)
    result = run_json(world.app, "cancel", task_id, "--reason", "stop it")
    assert result["error"]["code"] == "lease-live"


def test_executions_lists_by_state_and_unpark_gives_a_parked_one_another_go(
    world: World,
) -> None:
    task_id = world.publish()
    for _ in range(CAP + 1):
        world.start(task_id)
        world.die()
        world.sweep()
        world.clock.advance(2 * INTERVAL_SECONDS + 1)
    assert world.execution(task_id).state is ExecutionState.PARKED
    listed = run_json(world.app, "executions", "--state", "parked")
    assert [e["id"] for e in listed["executions"]] == [task_id]
    publishes = world.publishes_of(task_id)
    result = run(world.app, "unpark", task_id, "--reason", "fixed the OOM")
    assert result.exit_code == 0, result.output
    record = world.execution(task_id)
    assert record.state is ExecutionState.WAITING
    assert world.publishes_of(task_id) == publishes + 1
    again = run(world.app, "unpark", task_id, "--reason", "again")
    assert again.exit_code == EXIT_REFUSED


def test_sweep_once_prints_its_counts(world: World) -> None:
    task_id = world.publish()
    world.clock.advance(3600)
    data = run_json(world.app, "sweep")
    assert data["republished"] == 1
    assert data["republished_ids"] == [task_id]
    assert "Sweep done" in run(world.app, "sweep").output


def test_sweep_loop_stops_after_max_runs(world: World) -> None:
    result = run(world.app, "sweep", "--loop", "--interval", "0.1", "--max-runs", "2", "--json")
    assert result.exit_code == 0
    assert len([line for line in result.output.splitlines() if line.startswith("{")]) == 2


def test_migrate_is_idempotent_and_names_the_revision(world: World) -> None:
    data = run_json(world.app, "migrate")
    assert data["revision"]
    assert run(world.app, "migrate").exit_code == 0


def test_migrate_names_the_store_s_deployment_id_which_is_the_app_s_tenant(
    world: World,
) -> None:
    data = run_json(world.app, "migrate")
    assert data["deployment_id"] == data["tenant"] == AGBoss.of(world.app).tenant
    assert f"deployment id {data['deployment_id']}." in run(world.app, "migrate").output


def test_an_app_without_agboss_exits_with_what_to_do() -> None:
    app = Celery("bare", broker="memory://")
    result = run(app, "pending")
    assert result.exit_code == EXIT_CONFIGURATION
    assert "AGBoss(app)" in result.output


# --- the real thing ------------------------------------------------------------------------


def test_celery_agboss_pending_runs_as_a_celery_subcommand(
    no_lookup: World, ops_store_url: str
) -> None:
    """Acceptance: the entry point plugs ``agboss`` into ``celery`` itself."""
    task_id, key = _waiting_for_operator(no_lookup)
    config = {"database_url": ops_store_url, "clock_offset_ms": no_lookup.clock.offset_ms()}
    completed = subprocess.run(
        ops_app_command("agboss", "pending"),
        env=ops_app_env(config, PATH="/usr/bin:/bin"),
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert key in completed.stdout and task_id in completed.stdout
    # The hints name the app as this command was given it, not the docs' `proj`.
    assert "celery -A tests.operations.apps.ops_app:app agboss resolve KEY" in completed.stdout
    assert "celery -A proj" not in completed.stdout, completed.stdout


def test_resolve_completed_is_refused_where_the_call_is_not_registered(
    no_lookup: World, ops_store_url: str
) -> None:
    """Fail closed: without the call, its masking policy is unknown; nothing is stored.
    Unknown here: not registered with this app, and declared twice in the process (so
    the declaration cannot say which one the intent belongs to)."""
    from dataclasses import replace

    from celery_agboss import AGBoss
    from celery_agboss.signals import disconnect

    _, key = _waiting_for_operator(no_lookup)
    second_declaration = replace(no_lookup.call)  # another "ops.charge" in this process
    app = Celery("unregistered", broker="memory://")
    app.conf.update(
        agboss_database_url=ops_store_url, agboss_pseudonym_key="operations-tests-pseudonym-key"
    )
    boss = AGBoss(app)
    boss.clock_offset_source = no_lookup.clock.offset_ms
    try:
        result = run(app, "resolve", key, "--completed", '{"id": "ch_1"}', "--reason", "x")
    finally:
        disconnect(boss)
        app.close()
    assert result.exit_code == EXIT_REFUSED
    assert "AGBoss(app).register(call)" in result.output
    del second_declaration
    (intent,) = no_lookup.intents(no_lookup.execution(intent_execution(no_lookup, key)).id)
    assert intent.status is IntentStatus.PENDING


def intent_execution(world: World, key: str) -> str:
    intent = world.agboss.store.read_intent(key)
    assert intent is not None
    return intent.execution_id
