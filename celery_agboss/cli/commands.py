"""``celery -A proj agboss …``: the operator's commands, plugged into Celery's own CLI.

Registered through the ``celery.commands`` entry point (``agboss =
celery_agboss.cli:agboss``), so ``-A proj`` loads the app as for any Celery command.
Output is for people; ``--json`` gives the same for machines. A refused action exits
non-zero and says what was wrong and what to do:

====  =====================================================================
code  meaning
====  =====================================================================
0     done
1     refused (an intent may be in flight, a lease is live, wrong state…)
2     bad usage (click's own code)
3     not found
4     celery_agboss is not configured, or the store cannot be reached
====  =====================================================================

Celery loads this plugin for every ``celery`` command (``worker`` and ``beat``
included), so each command imports the store, the operator's verbs and the sweep
only when it runs: those imports are deferred for start-up time alone.
"""

from __future__ import annotations

import functools
import json
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from celery_agboss.cli.views import (
    RESOLVE_HINT,
    age,
    describe_text,
    execution_view,
    history_view,
    intent_state,
    intent_view,
    iso,
    lease_view,
    report_data,
    report_text,
    table,
    waits_for_operator,
)
from celery_agboss.core.executions import ExecutionState
from celery_agboss.errors import ConfigurationError, OperatorRefusedError, StoreError

if TYPE_CHECKING:
    from celery_agboss.app import AGBoss
    from celery_agboss.sweep import SweepReport

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFIGURATION = 4

F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
actor_option = click.option(
    "--actor",
    default=None,
    metavar="NAME",
    help="Who acts, for the audit trail (default: the OS user).",
)
reason_option = click.option(
    "--reason", required=True, metavar="TEXT", help="Why; recorded in the audit trail."
)


# --- plumbing -----------------------------------------------------------------------


class _Out:
    """Where a command writes: people's text or one JSON document."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def emit(self, data: Any, text: str | Callable[[], str]) -> None:
        if self.as_json:
            click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
        else:
            click.echo(text() if callable(text) else text)

    def fail(self, code: int, kind: str, message: str) -> NoReturn:
        if self.as_json:
            click.echo(json.dumps({"error": {"code": kind, "message": message}}, indent=2))
        else:
            click.echo(f"Error: {message}", err=True)
        raise SystemExit(code)


def _celery_app(ctx: click.Context) -> Any:
    app = getattr(ctx.obj, "app", None)
    if app is None:
        raise click.UsageError("no Celery app: run it as `celery -A proj agboss …`")
    return app


@contextmanager
def _agboss(ctx: click.Context, out: _Out) -> Iterator[AGBoss]:
    """The app's AGBoss, its store closed after the command; configuration and store
    trouble become exit code 4 with the message that says what to set."""
    from celery_agboss.app import AGBoss

    agboss: AGBoss | None = None
    try:
        agboss = AGBoss.of(_celery_app(ctx))
        agboss.settings  # noqa: B018 - refuses a wrong configuration now, with its reason
        yield agboss
    except OperatorRefusedError as exc:
        code = getattr(exc, "code", "refused")
        out.fail(EXIT_NOT_FOUND if code == "not-found" else EXIT_REFUSED, code, str(exc))
    except ConfigurationError as exc:
        out.fail(EXIT_CONFIGURATION, "configuration", str(exc))
    except StoreError as exc:
        out.fail(
            EXIT_CONFIGURATION,
            "store",
            f"the store could not be used ({type(exc).__name__}: {exc}); check "
            "agboss_database_url and that the database is up, and that `celery -A proj "
            "agboss migrate` was run",
        )
    finally:
        if agboss is not None:
            agboss.close()


def _command(fn: F) -> F:
    """Every subcommand gets ``--json``."""
    return json_option(fn)


# --- the group ------------------------------------------------------------------------


@click.group(name="agboss")
@click.pass_context
def agboss(ctx: click.Context) -> None:
    """celery_agboss: payments waiting for an operator, resolve, cancel, the sweep."""


@agboss.command()
@_command
@click.pass_context
def migrate(ctx: click.Context, as_json: bool) -> None:
    """Create or upgrade the celery_agboss tables (idempotent; safe on every deploy)."""
    from celery_agboss.store.migrate import current_revision
    from celery_agboss.store.migrate import migrate as run_migrations

    out = _Out(as_json)
    with _agboss(ctx, out) as boss:
        settings = boss.settings
        run_migrations(settings.database_url)
        revision = current_revision(settings.database_url)
        url = settings.redacted_database_url()
        out.emit(
            {"database": url, "revision": revision},
            f"The store at {url} is at revision {revision}.",
        )


@agboss.command()
@click.option("--operator-only", is_flag=True, help="Only what waits for an operator.")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10000))
@_command
@click.pass_context
def pending(ctx: click.Context, operator_only: bool, limit: int, as_json: bool) -> None:
    """Outbound calls that may have reached the gateway and are not settled, and every
    execution waiting for an operator with the command that ends its wait."""
    from celery_agboss.operator import list_pending, list_waits

    out = _Out(as_json)
    with _agboss(ctx, out) as boss:
        intents = list_pending(boss, operator_only=operator_only, limit=limit)
        flagged = sum(1 for i in intents if waits_for_operator(i))
        waits = list_waits(boss, limit=limit)

        def text() -> str:
            parts = []
            if intents:
                rows = [
                    [
                        i.idempotency_key,
                        i.execution_id,
                        i.name,
                        str(i.attempt),
                        age(i.read_at_ms, i.first_attempt_at_ms),
                        intent_state(i),
                    ]
                    for i in intents
                ]
                head = (
                    f"{len(intents)} outbound call(s) not settled, "
                    f"{flagged} waiting for an operator:"
                )
                hint = RESOLVE_HINT if flagged else ""
                listing = table(["KEY", "EXECUTION", "CALL", "ATTEMPT", "AGE", "STATE"], rows)
                parts.append(f"{head}\n{listing}{hint}")
            else:
                parts.append("Nothing pending: every outbound call is settled.")
            if waits:
                rows = [
                    [w.execution.id, w.execution.task_name, w.execution.reason or "", w.ends_with]
                    for w in waits
                ]
                parts.append(
                    f"{len(waits)} execution(s) waiting for an operator:\n"
                    + table(["EXECUTION", "TASK", "WHY", "ENDS WITH"], rows)
                )
            return "\n\n".join(parts)

        out.emit(
            {
                "pending": [intent_view(i) for i in intents],
                "needs_operator": flagged,
                "waiting_executions": [
                    {**execution_view(w.execution), "intents": w.intents, "ends_with": w.ends_with}
                    for w in waits
                ],
            },
            text,
        )


@agboss.command()
@click.argument("key")
@_command
@click.pass_context
def show(ctx: click.Context, key: str, as_json: bool) -> None:
    """One intent (by idempotency key) or execution (by task id), with its history."""
    from celery_agboss.operator import describe

    out = _Out(as_json)
    with _agboss(ctx, out) as boss:
        found = describe(boss, key)
        data = {
            "execution": None if found.execution is None else execution_view(found.execution),
            "lease": lease_view(found.lease),
            "intents": [intent_view(i, full=True) for i in found.intents],
            "history": {k: [history_view(r) for r in rows] for k, rows in found.history.items()},
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
@reason_option
@actor_option
@_command
@click.pass_context
def resolve(
    ctx: click.Context,
    key: str,
    completed_json: str | None,
    not_sent: bool,
    reason: str,
    actor: str | None,
    as_json: bool,
) -> None:
    """Settle an intent you checked at the gateway; its execution then goes on."""
    from celery_agboss.operator import resolve as resolve_intent

    out = _Out(as_json)
    if (completed_json is None) == (not not_sent):
        out.fail(
            EXIT_USAGE,
            "usage",
            "say what the gateway shows: exactly one of --completed RESULT_JSON or --not-sent",
        )
    kwargs: dict[str, Any] = {"not_sent": True} if not_sent else {}
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
    with _agboss(ctx, out) as boss:
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
@_command
@click.pass_context
def executions(
    ctx: click.Context, states: tuple[str, ...], limit: int, after_id: str | None, as_json: bool
) -> None:
    """Executions (one per task id) and their states."""
    from celery_agboss.operator import list_executions

    out = _Out(as_json)
    with _agboss(ctx, out) as boss:
        chosen = [ExecutionState(s.upper()) for s in states]
        records = list_executions(boss, states=chosen or None, limit=limit, after_id=after_id)

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
                    (r.reason or "")[:60],
                ]
                for r in records
            ]
            return table(["ID", "TASK", "STATE", "RECOVERIES", "AGE", "REASON"], rows)

        out.emit({"executions": [execution_view(r) for r in records]}, text)


@agboss.command()
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10000))
@_command
@click.pass_context
def pauses(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Pauses waiting for an answer (answer one with `agboss answer-pause PAUSE_ID ANSWER`)."""
    from celery_agboss.operator import list_pauses

    out = _Out(as_json)
    with _agboss(ctx, out) as boss:
        found = list_pauses(boss, limit=limit)

        def text() -> str:
            if not found:
                return "No pause waits for an answer."
            return table(["PAUSE", "EXECUTION", "STATUS"], [list(row) for row in found])

        out.emit(
            {"pauses": [{"pause_id": p, "execution": e, "status": st} for p, e, st in found]}, text
        )


@agboss.command()
@click.argument("execution_id")
@reason_option
@actor_option
@_command
@click.pass_context
def unpark(
    ctx: click.Context, execution_id: str, reason: str, actor: str | None, as_json: bool
) -> None:
    """Give a PARKED execution (recovery cap reached) another go."""
    from celery_agboss.operator import unpark as unpark_execution

    out = _Out(as_json)
    with _agboss(ctx, out) as boss:
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
@_command
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

    out = _Out(as_json)
    with _agboss(ctx, out) as boss:
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
@_command
@click.pass_context
def accept(
    ctx: click.Context, execution_id: str, reason: str, actor: str | None, as_json: bool
) -> None:
    """Accept a divergence: COMPLETED with the result the re-run's body returned."""
    from celery_agboss.operator import accept as accept_divergence

    out = _Out(as_json)
    with _agboss(ctx, out) as boss:
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
@_command
@click.pass_context
def redrive(
    ctx: click.Context, execution_id: str, reason: str, actor: str | None, as_json: bool
) -> None:
    """Send on an execution waiting for an operator once nothing is left to decide."""
    from celery_agboss.operator import redrive as redrive_execution

    out = _Out(as_json)
    with _agboss(ctx, out) as boss:
        republished = redrive_execution(boss, execution_id, reason, actor=actor)
        record = boss.executions.read_execution(execution_id)
        assert record is not None
        text = (
            f"Re-drove {execution_id}: published again."
            if republished
            else f"{execution_id} is WAITING again; the sweep publishes it."
        )
        out.emit({"execution": execution_view(record), "republished": republished}, text)


@agboss.command()
@click.option("--loop", is_flag=True, help="Sweep every interval until stopped (no beat).")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=None,
    metavar="SECONDS",
    help="With --loop: seconds between runs (default: agboss_sweep_interval).",
)
@click.option(
    "--max-runs",
    type=click.IntRange(min=1),
    default=None,
    help="With --loop: stop after this many runs.",
)
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=None, help="Rows per step and run."
)
@_command
@click.pass_context
def sweep(
    ctx: click.Context,
    loop: bool,
    interval: float | None,
    max_runs: int | None,
    batch_size: int | None,
    as_json: bool,
) -> None:
    """Re-drive and reconcile what dead workers and lost messages left (never sends money)."""
    from celery_agboss.sweep import DEFAULT_BATCH_SIZE, run_sweep, run_sweep_loop

    out = _Out(as_json)
    batch = batch_size or DEFAULT_BATCH_SIZE
    with _agboss(ctx, out) as boss:
        if not loop:
            report = run_sweep(boss, batch_size=batch)
            out.emit(report_data(report), report_text(report))
            return
        stop = threading.Event()
        with _stop_on_signals(stop):
            run_sweep_loop(
                boss,
                interval_seconds=interval,
                batch_size=batch,
                max_runs=max_runs,
                stop=stop,
                on_report=functools.partial(_print_report, as_json),
            )


def _print_report(as_json: bool, report: SweepReport) -> None:
    if as_json:
        click.echo(json.dumps(report_data(report), sort_keys=True))
    else:
        click.echo(report_text(report))


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT end the loop after the current run (never in the middle)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


__all__ = ["EXIT_CONFIGURATION", "EXIT_NOT_FOUND", "EXIT_REFUSED", "EXIT_USAGE", "agboss"]
