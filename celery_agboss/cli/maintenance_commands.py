"""``agboss migrate | sweep | rotate-keys``: the store's tables (and its deployment id
when the store is a copy: ``--new-deployment-id``, ``--same-deployment``), the sweep run by hand or
in a loop (for a deployment without beat, ``agboss_sweep_interval = 0``), and the sealed
columns re-sealed with the first encryption key."""

from __future__ import annotations

import functools
import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from celery_agboss.cli.group import (
    EXIT_CONFIGURATION,
    EXIT_REFUSED,
    EXIT_USAGE,
    CommandOutput,
    actor_option,
    agboss,
    json_command,
    open_runtime,
)
from celery_agboss.cli.views import report_data, report_text

if TYPE_CHECKING:
    from celery_agboss.store.rotation import RotationReport
    from celery_agboss.sweep import SweepReport


@agboss.command()
@click.option(
    "--new-deployment-id",
    "new_id",
    is_flag=True,
    help="Give a copied store a fresh deployment id (refused while anything is in flight).",
)
@click.option(
    "--same-deployment",
    is_flag=True,
    help="This copied store replaces the original (a restore, a move): record where it is.",
)
@click.option(
    "--workers-stopped",
    is_flag=True,
    help="With --new-deployment-id: every worker of this store is stopped, go on even "
    "when the broker cannot be asked (a worker that answers still refuses it).",
)
@actor_option
@json_command
@click.pass_context
def migrate(
    ctx: click.Context,
    new_id: bool,
    same_deployment: bool,
    workers_stopped: bool,
    actor: str | None,
    as_json: bool,
) -> None:
    """Create or upgrade the celery_agboss tables (idempotent; safe on every deploy); say
    when the store is a copy of another (its deployment id, so its keys, are the other's)."""
    from celery_agboss.operator.common import default_actor
    from celery_agboss.store import deployment
    from celery_agboss.store.migrate import current_revision
    from celery_agboss.store.migrate import migrate as run_migrations

    out = CommandOutput(as_json)
    if new_id and same_deployment:
        out.fail(EXIT_USAGE, "usage", "give --new-deployment-id or --same-deployment, not both")
    if workers_stopped and not new_id:
        out.fail(EXIT_USAGE, "usage", "--workers-stopped goes with --new-deployment-id only")
    with open_runtime(ctx, out) as runtime:
        settings = runtime.settings
        run_migrations(settings.database_url)
        done = ""
        if new_id:
            _refuse_while_workers_answer(runtime.app, out, workers_stopped=workers_stopped)
            old, new = deployment.new_deployment_id(runtime.store, actor=actor or default_actor())
            done = (
                f" The deployment id was {old!r}, now {new!r}: restart every worker, beat "
                "and process of this store, so that none keys with the old one."
            )
        elif same_deployment:
            deployment.same_deployment(runtime.store)
            done = " Recorded where the store is now as its deployment id's place."
        with runtime.store.read_transaction() as tx:
            check = deployment.check_place(tx.connection)
        revision = current_revision(settings.database_url)
        url = settings.redacted_database_url()
        used = "" if settings.tenant is None else f"; agboss_tenant {settings.tenant!r} is used"
        warning = f"\nWARNING: {check.copy_warning()}" if check.is_copy else ""
        out.emit(
            {
                "database": url,
                "revision": revision,
                "deployment_id": check.deployment_id,
                "tenant": settings.tenant or check.deployment_id,
                "copy": check.is_copy,
                "minted_at": check.recorded,
                "found_at": check.current,
            },
            f"The store at {url} is at revision {revision}, deployment id "
            f"{check.deployment_id}{used}.{done}{warning}",
        )


_PING_SECONDS = 2.0
"""How long ``--new-deployment-id`` waits for the app's workers to answer a ping."""


def _refuse_while_workers_answer(app: Any, out: CommandOutput, *, workers_stopped: bool) -> None:
    """A worker keeps the deployment id it read at start: one still up when the id changes
    may charge under the old key and, redelivered after a crash, the payment is sent
    again under the new one (two charges). So the app's workers are asked (Celery's
    remote control) and any that answers refuses the change; a broker that cannot be
    asked refuses it too, unless the operator says every worker is stopped."""
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=_PING_SECONDS)
            replies = app.control.ping(timeout=_PING_SECONDS, connection=conn) or []
    except Exception as exc:
        if workers_stopped:
            return
        out.fail(
            EXIT_REFUSED,
            "workers-unknown",
            "the deployment id was not changed: the app's workers could not be asked "
            f"whether any still runs (the broker: {type(exc).__name__}: {exc}). A worker "
            "still up keeps the old id and a payment it sent may be sent again under the "
            "new one. Stop every worker of this store, then run `celery -A proj agboss "
            "migrate --new-deployment-id --workers-stopped`.",
        )
    names = sorted({str(name) for reply in replies for name in reply})
    if names:
        out.fail(
            EXIT_REFUSED,
            "workers-running",
            f"the deployment id was not changed: {len(names)} worker(s) of this app still "
            f"answer: {', '.join(names)}. A worker keeps the id it read at start, so one "
            "that sent a payment under the old id would send it again under the new one "
            "after a crash. Stop every worker of this store first (and its beat), then "
            "run this again.",
        )


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
@json_command
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

    out = CommandOutput(as_json)
    batch = batch_size or DEFAULT_BATCH_SIZE
    with open_runtime(ctx, out) as runtime:
        if not loop:
            report = run_sweep(runtime, batch_size=batch)
            out.emit(report_data(report), report_text(report))
            return
        stop = threading.Event()
        with _stop_on_signals(stop):
            run_sweep_loop(
                runtime,
                interval_seconds=interval,
                batch_size=batch,
                max_runs=max_runs,
                stop=stop,
                on_report=functools.partial(_print_report, as_json),
            )


@agboss.command("rotate-keys")
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=None, help="Rows per transaction."
)
@json_command
@click.pass_context
def rotate_keys(ctx: click.Context, batch_size: int | None, as_json: bool) -> None:
    """Re-seal stored records with the first agboss_encryption_keys key (resumable)."""
    from celery_agboss.store.rotation import DEFAULT_BATCH
    from celery_agboss.store.rotation import rotate_keys as run_rotation

    out = CommandOutput(as_json)
    with open_runtime(ctx, out) as runtime:
        report = run_rotation(runtime.store, batch_size=batch_size or DEFAULT_BATCH)
        busy = sum(report.left.values()) - len(report.unopenable)
        text = f"Re-sealed {report.total} values with key {report.sealing_key!r}"
        if report.complete:
            text += "; every sealed column is sealed with it."
        elif busy > 0:
            text += f"; {busy} were busy or raced and are left: run rotate-keys again."
        else:
            text += "."
        out.emit(report.as_dict(), text + _unopenable_text(report))
        if report.unopenable:
            ctx.exit(EXIT_CONFIGURATION)
        if not report.complete:
            ctx.exit(1)


_UNOPENABLE_SHOWN = 20
"""The values no key opens the text names one by one (``--json`` names every one)."""


def _unopenable_text(report: RotationReport) -> str:
    """The values no configured key opens, each named: left as they are, until a run
    is given the key that sealed them (never drop that key before)."""
    if not report.unopenable:
        return ""
    lines = [
        f"  {value.table}.{value.column} of row {value.row_key}: sealed under key "
        f"{value.key_id!r}, not opened by any configured key"
        for value in report.unopenable[:_UNOPENABLE_SHOWN]
    ]
    more = len(report.unopenable) - _UNOPENABLE_SHOWN
    if more > 0:
        lines.append(f"  … and {more} more (--json lists every one)")
    return (
        f"\n{len(report.unopenable)} value(s) no configured key opens were left as they "
        "are (the other rows were re-sealed); add the key that sealed them to "
        "agboss_encryption_keys and run rotate-keys again:\n" + "\n".join(lines)
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
