"""``agboss resolve | unpark | cancel | accept | redrive``: an operator's decisions,
each refused with its reason when it could double a payment, each in the audit trail."""

from __future__ import annotations

import json
from typing import Any

import click

from celery_agboss.cli.group import (
    EXIT_USAGE,
    CommandOutput,
    actor_option,
    agboss,
    json_command,
    open_agboss,
    reason_option,
)
from celery_agboss.cli.views import execution_view, intent_view
from celery_agboss.core.executions import ExecutionState


@agboss.command()
@click.argument("key")
@click.option(
    "--completed",
    "completed_json",
    metavar="RESULT_JSON",
    default=None,
    help="The payment exists: its result, as JSON (what send would have returned).",
)
@click.option(
    "--not-sent",
    is_flag=True,
    help="The gateway never processed it: the next delivery sends it again.",
)
@click.option(
    "--may-charge-twice",
    is_flag=True,
    help="With --not-sent past the key's retention at the gateway: send it again anyway, "
    "knowing that if the gateway did process it, the resend is a second charge.",
)
@reason_option
@actor_option
@json_command
@click.pass_context
def resolve(
    ctx: click.Context,
    key: str,
    completed_json: str | None,
    not_sent: bool,
    may_charge_twice: bool,
    reason: str,
    actor: str | None,
    as_json: bool,
) -> None:
    """Settle an intent you checked at the gateway; its execution then goes on."""
    from celery_agboss.operator import resolve as resolve_intent

    out = CommandOutput(as_json)
    if (completed_json is None) == (not not_sent):
        out.fail(
            EXIT_USAGE,
            "usage",
            "say what the gateway shows: exactly one of --completed RESULT_JSON or --not-sent",
        )
    kwargs: dict[str, Any] = {"not_sent": True} if not_sent else {}
    if may_charge_twice:
        kwargs["may_charge_twice"] = True
    if completed_json is not None:
        try:
            kwargs["completed"] = json.loads(completed_json)
        except ValueError as exc:
            out.fail(
                EXIT_USAGE,
                "usage",
                f"--completed must be JSON ({exc}), for example "
                '--completed \'{"id": "ch_123", "status": "succeeded"}\'',
            )
    with open_agboss(ctx, out) as boss:
        result = resolve_intent(boss, key, reason=reason, actor=actor, **kwargs)
        execution = result.execution
        data = {
            "intent": intent_view(result.intent),
            "execution": None if execution is None else execution_view(execution),
            "republished": result.republished,
        }
        text = (
            f"Resolved {key}: {result.intent.status.value}"
            f"{' (it will be sent again)' if not_sent else ' (nothing will be sent)'}."
        )
        if execution is not None:
            text += f"\nExecution {execution.id} is {execution.state.value}"
            text += (
                "; its message was published again."
                if result.republished
                else "."
                if execution.state.value != "WAITING_OPERATOR"
                else "; another intent still needs you (agboss pending)."
            )
        out.emit(data, text)


@agboss.command()
@click.argument("execution_id")
@reason_option
@actor_option
@json_command
@click.pass_context
def unpark(
    ctx: click.Context, execution_id: str, reason: str, actor: str | None, as_json: bool
) -> None:
    """Give a PARKED execution (recovery cap reached) another go."""
    from celery_agboss.operator import unpark as unpark_execution

    out = CommandOutput(as_json)
    with open_agboss(ctx, out) as boss:
        result = unpark_execution(boss, execution_id, reason, actor=actor)
        out.emit(
            {"execution": execution_view(result.execution), "republished": result.republished},
            f"Unparked {execution_id}: {result.execution.state.value}"
            + ("; its message was published again." if result.republished else "."),
        )


@agboss.command()
@click.argument("execution_id")
@click.option(
    "--payments-handled",
    is_flag=True,
    help="Confirm the cancel of an execution whose payment completed (after "
    "refunding it at the gateway, or deciding to keep it).",
)
@reason_option
@actor_option
@json_command
@click.pass_context
def cancel(
    ctx: click.Context,
    execution_id: str,
    payments_handled: bool,
    reason: str,
    actor: str | None,
    as_json: bool,
) -> None:
    """Cancel an execution that is not running; refused while a payment may be in flight."""
    from celery_agboss.operator import cancel as cancel_execution

    out = CommandOutput(as_json)
    with open_agboss(ctx, out) as boss:
        record = cancel_execution(
            boss, execution_id, reason, actor=actor, payments_handled=payments_handled
        )
        if record.state is ExecutionState.CANCELLED:
            text = f"Cancelled {execution_id}: it will never run."
        elif record.state is ExecutionState.WAITING_OPERATOR:
            text = (
                f"{execution_id} completed a payment, so it is not cancelled silently: it "
                "waits for you. Refund the payment at the gateway if it must go, then "
                f"`celery -A proj agboss cancel {execution_id} --payments-handled "
                "--reason TEXT`."
            )
        else:
            text = (
                f"Cancel requested for {execution_id} ({record.state.value}); the sweep "
                "cancels it once nothing is pending."
            )
        out.emit({"execution": execution_view(record)}, text)


@agboss.command()
@click.argument("execution_id")
@reason_option
@actor_option
@json_command
@click.pass_context
def accept(
    ctx: click.Context, execution_id: str, reason: str, actor: str | None, as_json: bool
) -> None:
    """Accept a divergence: COMPLETED with the result the re-run's body returned."""
    from celery_agboss.operator import accept as accept_divergence

    out = CommandOutput(as_json)
    with open_agboss(ctx, out) as boss:
        accept_divergence(boss, execution_id, reason, actor=actor)
        record = boss.executions.read_execution(execution_id)
        assert record is not None
        out.emit(
            {"execution": execution_view(record)},
            f"Accepted {execution_id}: COMPLETED; published again to hand its result on.",
        )


@agboss.command()
@click.argument("execution_id")
@reason_option
@actor_option
@json_command
@click.pass_context
def redrive(
    ctx: click.Context, execution_id: str, reason: str, actor: str | None, as_json: bool
) -> None:
    """Send on an execution waiting for an operator once nothing is left to decide."""
    from celery_agboss.operator import redrive as redrive_execution

    out = CommandOutput(as_json)
    with open_agboss(ctx, out) as boss:
        republished = redrive_execution(boss, execution_id, reason, actor=actor)
        record = boss.executions.read_execution(execution_id)
        assert record is not None
        text = (
            f"Re-drove {execution_id}: published again."
            if republished
            else f"{execution_id} is WAITING again; the sweep publishes it."
        )
        out.emit({"execution": execution_view(record), "republished": republished}, text)


@agboss.command("payments-handled")
@click.argument("execution_id")
@reason_option
@actor_option
@json_command
@click.pass_context
def payments_handled(
    ctx: click.Context, execution_id: str, reason: str, actor: str | None, as_json: bool
) -> None:
    """Say the payment a FAILED or CANCELLED execution left behind is dealt with."""
    from celery_agboss.operator import payments_handled as mark_handled

    out = CommandOutput(as_json)
    with open_agboss(ctx, out) as boss:
        record = mark_handled(boss, execution_id, reason, actor=actor)
        out.emit(
            {"execution": execution_view(record)},
            f"{execution_id} ({record.state.value}): its payments are marked handled; "
            "`agboss pending` no longer lists it.",
        )


__all__ = ["accept", "cancel", "payments_handled", "redrive", "resolve", "unpark"]
