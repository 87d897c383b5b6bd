"""``agboss resolve | unpark | cancel | accept | redrive``: an operator's decisions,
each refused with its reason when it could double a payment, each in the audit trail."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from celery_agboss.cli.group import (
    EXIT_USAGE,
    CommandOutput,
    actor_option,
    agboss,
    json_command,
    open_runtime,
    reason_option,
)
from celery_agboss.cli.views import execution_view, intent_view
from celery_agboss.core.executions import ExecutionState, WaitKind, wait_kind

if TYPE_CHECKING:
    from celery_agboss.app import AGBoss


def _on_one_execution(
    *options: Callable[[Any], Any], name: str | None = None
) -> Callable[[Callable[..., None]], click.Command]:
    """An operator's decision on one execution as a command: ``EXECUTION_ID``, the
    command's own ``options``, then ``--reason``, ``--actor`` and ``--json``. The
    decision is called inside the opened app, as ``decide(runtime, out, execution_id,
    reason=..., actor=..., <its options>)``."""

    def command(decide: Callable[..., None]) -> click.Command:
        @functools.wraps(decide)
        def run(ctx: click.Context, as_json: bool, **params: Any) -> None:
            out = CommandOutput(as_json)
            with open_runtime(ctx, out) as runtime:
                decide(runtime, out, **params)

        wrapped: Callable[..., Any] = click.pass_context(run)
        for decorator in (
            json_command,
            actor_option,
            reason_option,
            *reversed(options),
            click.argument("execution_id"),
        ):
            wrapped = decorator(wrapped)
        return agboss.command(name=name)(wrapped)

    return command


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
    with open_runtime(ctx, out) as runtime:
        result = resolve_intent(runtime, key, reason=reason, actor=actor, **kwargs)
        execution = result.execution
        data = {
            "intent": intent_view(result.intent),
            "execution": None if execution is None else execution_view(execution),
            "republished": result.republished,
            "republished_ids": list(result.republished_ids),
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
        others = [i for i in result.republished_ids if execution is None or i != execution.id]
        if others:
            text += f"\nAlso published again (they waited on it too): {', '.join(others)}."
        out.emit(data, text)


@_on_one_execution()
def unpark(
    runtime: AGBoss, out: CommandOutput, execution_id: str, reason: str, actor: str | None
) -> None:
    """Give a PARKED execution (recovery cap reached) another go."""
    from celery_agboss.operator import unpark as unpark_execution

    result = unpark_execution(runtime, execution_id, reason, actor=actor)
    out.emit(
        {"execution": execution_view(result.execution), "republished": result.republished},
        f"Unparked {execution_id}: {result.execution.state.value}"
        + ("; its message was published again." if result.republished else "."),
    )


@_on_one_execution(
    click.option(
        "--payments-handled",
        is_flag=True,
        help="Confirm the cancel of an execution whose payment completed (after "
        "refunding it at the gateway, or deciding to keep it); the undos of its "
        "fenced effects still run.",
    )
)
def cancel(
    runtime: AGBoss,
    out: CommandOutput,
    execution_id: str,
    payments_handled: bool,
    reason: str,
    actor: str | None,
) -> None:
    """Cancel an execution that is not running; refused while a payment may be in flight."""
    from celery_agboss.operator import cancel as cancel_execution

    record = cancel_execution(
        runtime, execution_id, reason, actor=actor, payments_handled=payments_handled
    )
    if record.state is ExecutionState.CANCELLED:
        text = f"Cancelled {execution_id}: it will never run."
    elif (
        record.state is ExecutionState.WAITING_OPERATOR
        and wait_kind(record.reason) is WaitKind.CANCELLED_AFTER_PAYMENT
    ):
        text = (
            f"{execution_id} completed a payment, so it is not cancelled silently: it "
            "waits for you. Refund the payment at the gateway if it must go, then "
            f"`celery -A proj agboss cancel {execution_id} --payments-handled "
            "--reason TEXT`."
        )
    elif record.state is ExecutionState.COMPENSATING:
        handled = " (its payments are marked handled; its other undos still run)"
        text = (
            f"{execution_id} declared undos that have not run"
            + (handled if payments_handled else "")
            + ": the sweep re-drives it (COMPENSATING), they run, then it ends CANCELLED "
            "(FAILED when a failure had started them)."
        )
    else:
        waiting = f": {record.reason}" if record.reason else ""
        text = (
            f"Cancel requested for {execution_id} ({record.state.value}{waiting}); the "
            "sweep cancels it once nothing is pending."
        )
    out.emit({"execution": execution_view(record)}, text)


@_on_one_execution()
def accept(
    runtime: AGBoss, out: CommandOutput, execution_id: str, reason: str, actor: str | None
) -> None:
    """Accept a divergence: COMPLETED with the result the re-run's body returned."""
    from celery_agboss.operator import accept as accept_divergence

    accept_divergence(runtime, execution_id, reason, actor=actor)
    record = runtime.executions.read_execution(execution_id)
    assert record is not None
    out.emit(
        {"execution": execution_view(record)},
        f"Accepted {execution_id}: COMPLETED; published again to hand its result on.",
    )


@_on_one_execution()
def redrive(
    runtime: AGBoss, out: CommandOutput, execution_id: str, reason: str, actor: str | None
) -> None:
    """Send on an execution waiting for an operator once nothing is left to decide."""
    from celery_agboss.operator import redrive as redrive_execution

    republished = redrive_execution(runtime, execution_id, reason, actor=actor)
    record = runtime.executions.read_execution(execution_id)
    assert record is not None
    if republished:
        text = f"Re-drove {execution_id}: published again."
    elif record.cancel_requested:
        text = (
            f"{execution_id} is WAITING again with a cancel pending: the sweep's next pass "
            "cancels it (its undos run); it is not re-run."
        )
    else:
        text = f"{execution_id} is WAITING again; the sweep publishes it."
    out.emit({"execution": execution_view(record), "republished": republished}, text)


@_on_one_execution(name="payments-handled")
def payments_handled(
    runtime: AGBoss, out: CommandOutput, execution_id: str, reason: str, actor: str | None
) -> None:
    """Say the payment a FAILED or CANCELLED execution left behind is dealt with."""
    from celery_agboss.operator import payments_handled as mark_handled

    record = mark_handled(runtime, execution_id, reason, actor=actor)
    out.emit(
        {"execution": execution_view(record)},
        f"{execution_id} ({record.state.value}): its payments are marked handled; "
        "`agboss pending` no longer lists it.",
    )
