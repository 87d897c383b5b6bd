"""``agboss pending | show | executions | pauses``: what waits, and why, read only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from celery_agboss.cli.group import CommandOutput, agboss, json_command, open_runtime
from celery_agboss.cli.views import (
    RESOLVE_HINT,
    age,
    chain_text,
    describe_text,
    execution_view,
    history_view,
    intent_state,
    intent_view,
    iso,
    lease_view,
    pause_view,
    table,
    unopened_note,
    waits_for_operator,
)
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.store_protocol import IntentRecord

if TYPE_CHECKING:
    from celery_agboss.operator.reading import OperatorWait, PaymentLeftBehind, SharedWait


@agboss.command()
@click.option("--operator-only", is_flag=True, help="Only what waits for an operator.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10000))
@json_command
@click.pass_context
def pending(ctx: click.Context, operator_only: bool, limit: int, as_json: bool) -> None:
    """Outbound calls that may have reached the gateway and are not settled, and every
    execution waiting for an operator with the command that ends its wait."""
    from celery_agboss.operator import (
        count_unsettled,
        list_failed_after_payment,
        list_pending,
        list_shared_waits,
        list_waits,
    )

    out = CommandOutput(as_json)
    with open_runtime(ctx, out) as runtime:
        intents = list_pending(runtime, operator_only=operator_only, limit=limit)
        flagged = sum(1 for i in intents if waits_for_operator(i))
        waits = list_waits(runtime, limit=limit)
        shared = list_shared_waits(runtime, limit=limit)
        left = list_failed_after_payment(runtime, limit=limit)
        # Left out by --operator-only, each may be a payment: said, never "all settled".
        others = _not_flagged(count_unsettled(runtime)) if operator_only else 0
        lists: dict[str, Sequence[object]] = {"pending": intents, "waiting_executions": waits}
        lists.update(failed_after_payment=left, waiting_on_executions=shared)

        out.emit(
            {
                "pending": [intent_view(i) for i in intents],
                "needs_operator": flagged,
                "unsettled_not_listed": others,
                "waiting_executions": [
                    {**execution_view(w.execution), "intents": w.intents, "ends_with": w.ends_with}
                    for w in waits
                ],
                "failed_after_payment": [
                    {**execution_view(p.execution), "intents": p.intents, "ends_with": p.ends_with}
                    for p in left
                ],
                "waiting_on_executions": [
                    {**execution_view(w.execution), "waits_for": w.other} for w in shared
                ],
                "limit_reached": [name for name, found in lists.items() if len(found) >= limit],
            },
            lambda: _pending_text(intents, flagged, waits, left, shared, limit, others),
        )


def _not_flagged(counted: tuple[int, int]) -> int:
    """Of ``count_unsettled``'s intents, those not flagged for an operator."""
    unsettled, flagged = counted
    return unsettled - flagged


def _with_note(cell: str, note: str) -> str:
    """A cell, and what of its row this process could not open (``unopened_note``)."""
    return f"{cell} — {note}" if note else cell


def _counted(found: Sequence[object], limit: int) -> str:
    """A list's length, or the limit it reached: a full page may hide more rows."""
    return (
        f"{limit}+ (--limit {limit} reached; raise it to see the rest)"
        if len(found) >= limit
        else str(len(found))
    )


def _pending_text(
    intents: Sequence[IntentRecord],
    flagged: int,
    waits: Sequence[OperatorWait],
    left: Sequence[PaymentLeftBehind],
    shared: Sequence[SharedWait],
    limit: int,
    others: int = 0,
) -> str:
    """``agboss pending`` as tables: unsettled calls, operator waits, payments left
    behind by a failed execution, and waits on another execution. ``others``: the
    unsettled calls ``--operator-only`` left out."""
    parts = []
    if intents:
        rows = [
            [
                i.idempotency_key,
                i.execution_id,
                i.name,
                str(i.attempt),
                age(i.read_at_ms, i.first_attempt_at_ms),
                _with_note(intent_state(i), unopened_note(i)),
            ]
            for i in intents
        ]
        head = f"{_counted(intents, limit)} outbound call(s) not settled, {flagged} waiting "
        head += "for an operator"
        if others:
            head += f" ({others} other(s) not settled: `celery -A proj agboss pending`)"
        head += ":"
        hint = RESOLVE_HINT if flagged else ""
        listing = table(["KEY", "EXECUTION", "CALL", "ATTEMPT", "AGE", "STATE"], rows)
        parts.append(f"{head}\n{listing}{hint}")
    elif others:
        parts.append(
            f"No outbound call waits for an operator; {others} other(s) not settled "
            "(each may be a payment, settled by the sweep or a delivery): "
            "`celery -A proj agboss pending` lists them."
        )
    else:
        parts.append("Nothing pending: every outbound call is settled.")
    if waits:
        rows = [
            [w.execution.id, w.execution.task_name, w.execution.reason or "", w.ends_with]
            for w in waits
        ]
        parts.append(
            f"{_counted(waits, limit)} execution(s) waiting for an operator:\n"
            + table(["EXECUTION", "TASK", "WHY", "ENDS WITH"], rows)
        )
    if left:
        rows = [
            [
                p.execution.id,
                _with_note(p.execution.state.value, unopened_note(p.execution)),
                ", ".join(p.intents),
                p.ends_with,
            ]
            for p in left
        ]
        parts.append(
            f"{_counted(left, limit)} execution(s) failed after a payment (the customer is "
            "charged):\n" + table(["EXECUTION", "STATE", "PAYMENTS", "ENDS WITH"], rows)
        )
    if shared:
        rows = [
            [w.execution.id, w.execution.state.value, w.other, w.execution.reason or ""]
            for w in shared
        ]
        parts.append(
            f"{_counted(shared, limit)} execution(s) waiting for another execution that shares a "
            "payment with them (nothing to do: each goes on when the other ends):\n"
            + table(["EXECUTION", "STATE", "WAITS FOR", "WHY"], rows)
        )
    return "\n\n".join(parts)


@agboss.command()
@click.argument("key")
@json_command
@click.pass_context
def show(ctx: click.Context, key: str, as_json: bool) -> None:
    """One intent (by idempotency key) or execution (by task id), with its history and
    its pauses (what each asks, and its answer)."""
    from celery_agboss.operator import describe

    out = CommandOutput(as_json)
    with open_runtime(ctx, out) as runtime:
        found = describe(runtime, key)
        data = {
            "execution": None if found.execution is None else execution_view(found.execution),
            "lease": lease_view(found.lease),
            "intents": [intent_view(i, full=True) for i in found.intents],
            "history": {k: [history_view(r) for r in rows] for k, rows in found.history.items()},
            "chains": {k: chain_text(v) for k, v in found.chains.items()},
            "used_by": found.used_by,
            "pauses": [pause_view(p) for p in found.pauses],
            "audit": [
                {
                    "id": a.id,
                    "at": iso(a.at_ms),
                    "actor": a.actor,
                    "action": a.action,
                    "target": a.target,
                    "reason": a.reason,
                    "before": a.before,
                    "after": a.after,
                }
                for a in found.audit
            ],
        }
        out.emit(data, lambda: describe_text(found))


@agboss.command()
@click.option(
    "--state",
    "states",
    multiple=True,
    metavar="STATE",
    type=click.Choice([s.value for s in ExecutionState], case_sensitive=False),
    help="Only executions in this state (repeatable).",
)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10000))
@click.option("--after", "after_id", default=None, metavar="ID", help="Page after this id.")
@json_command
@click.pass_context
def executions(
    ctx: click.Context, states: tuple[str, ...], limit: int, after_id: str | None, as_json: bool
) -> None:
    """Executions (one per task id) and their states."""
    from celery_agboss.operator import list_executions

    out = CommandOutput(as_json)
    with open_runtime(ctx, out) as runtime:
        chosen = [ExecutionState(s.upper()) for s in states]
        records = list_executions(runtime, states=chosen or None, limit=limit, after_id=after_id)

        def text() -> str:
            if not records:
                return "No executions" + (
                    f" in {', '.join(s.value for s in chosen)}." if chosen else "."
                )
            rows = [
                [
                    r.id,
                    r.task_name,
                    r.state.value,
                    str(r.recovery_count),
                    age(r.read_at_ms, r.requested_at_ms),
                    unopened_note(r) or (r.reason or "")[:60],
                ]
                for r in records
            ]
            return table(["ID", "TASK", "STATE", "RECOVERIES", "AGE", "REASON"], rows)

        out.emit({"executions": [execution_view(r) for r in records]}, text)


@agboss.command()
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10000))
@json_command
@click.pass_context
def pauses(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Pauses waiting for an answer (answer one with `agboss answer-pause PAUSE_ID ANSWER`),
    and answers given early that wait for their pause (status EARLY)."""
    from celery_agboss.operator import list_pauses

    out = CommandOutput(as_json)
    with open_runtime(ctx, out) as runtime:
        found = list_pauses(runtime, limit=limit)

        def text() -> str:
            if not found:
                return "No pause waits for an answer."
            rows = table(["PAUSE", "EXECUTION", "STATUS"], [list(row) for row in found])
            head = f"{_counted(found, limit)} pause(s):\n" if len(found) >= limit else ""
            return f"{head}{rows}\nWhat one asks: celery -A proj agboss show EXECUTION"

        out.emit(
            {"pauses": [{"pause_id": p, "execution": e, "status": st} for p, e, st in found]}, text
        )
