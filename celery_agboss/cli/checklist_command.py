"""``celery -A proj agboss checklist --adapter module:object``: the gateway
requirements against a sandbox (design: gateway requirements), and the probes of the
adapter's ``reconcile`` when it has one (design: OWN, reconcile).

What a gateway's docs promise and what the account behind your credentials does can
differ (a retention set per account, a feature switched off), so a team probes its
own adapter by hand before trusting it with money. The probes make real requests of a
small amount under a key prefix of their own per run; point the adapter at a sandbox.
Without the gateway's clock the retention probe is skipped (design: G3): its evidence says which
retention to check in the gateway's docs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import click

from celery_agboss.cli.group import EXIT_REFUSED, EXIT_USAGE, CommandOutput, agboss, json_command

if TYPE_CHECKING:
    from celery_agboss.testing.checklist import GatewayChecklistReport


def load_adapter(target: str) -> Any:
    """``module:object`` → the adapter (an object, or a callable returning one)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(
            f"{target!r} is not module:object (e.g. shop.gateways:stripe_adapter)",
            param_hint="--adapter",
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="--adapter"
        ) from exc
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise click.BadParameter(
                f"{module_name!r} has no {attribute!r}", param_hint="--adapter"
            )
        found = getattr(found, part)
    adapter = found if hasattr(found, "send") else found() if callable(found) else found
    if not callable(getattr(adapter, "send", None)):
        raise click.BadParameter(
            f"{target!r} has no send(amount, idempotency_key): give an adapter from "
            "celery_agboss.adapters (or a callable that returns one)",
            param_hint="--adapter",
        )
    return adapter


@agboss.command()
@click.option(
    "--adapter",
    "target",
    required=True,
    metavar="MODULE:OBJECT",
    help=("The adapter to probe, or a callable returning it (e.g. shop.gateways:stripe_adapter)."),
)
@click.option(
    "--key-prefix",
    default=None,
    metavar="TEXT",
    help=("Prefix of every probe's idempotency key (default: a new one per run)."),
)
@click.option(
    "--required-retention",
    default=86400.0,
    type=float,
    show_default=True,
    metavar="SECONDS",
    help="Your longest recovery: how long keys must be kept.",
)
@click.option(
    "--amount",
    default=100,
    type=int,
    show_default=True,
    metavar="MINOR_UNITS",
    help="The amount each probe charges.",
)
@json_command
@click.pass_context
def checklist(
    ctx: click.Context,
    target: str,
    key_prefix: str | None,
    required_retention: float,
    amount: int,
    as_json: bool,
) -> None:
    """Probe an adapter (design: gateway requirements, OWN, reconcile) with real requests, and
    whether the app's store is a copy of another (exit 1 when one failed)."""
    from celery_agboss.testing.checklist import gateway_checklist

    out = CommandOutput(as_json)
    if amount <= 0 or required_retention <= 0:
        out.fail(EXIT_USAGE, "usage", "--amount and --required-retention must be positive")
    adapter = load_adapter(target)
    lookup = getattr(adapter, "lookup", None)
    reconcile = getattr(adapter, "reconcile", None)
    report = gateway_checklist(
        adapter.send,
        lookup if callable(lookup) else None,
        clock=None,
        key_prefix=key_prefix,
        required_retention=required_retention,
        amount=amount,
        reconcile=reconcile if callable(reconcile) else None,
    )
    copy, deployment = _deployment_check(ctx)
    data = {
        "adapter": target,
        "deployment": deployment,
        "key_prefix": report.key_prefix,
        "passed": report.passed,
        "results": [
            {"requirement": r.requirement, "status": r.status.value, "evidence": r.evidence}
            for r in report.results
        ],
    }
    verdict = "FAILED (the store is a copy)" if copy and report.passed else _verdict(report)
    out.emit(
        data,
        f"{report}\n{deployment['text']}\nkeys under {report.key_prefix!r}; checklist {verdict}",
    )
    if copy or not report.passed:
        raise SystemExit(EXIT_REFUSED)


def _deployment_check(ctx: click.Context) -> tuple[bool, dict[str, Any]]:
    """Whether the app's store is a copy of the store its deployment id was minted in: a
    copy beside its original on one gateway account sends the original's keys (docs/keys.md,
    "A copy of a store"). Not checked (never failed) for an app without a store."""
    from celery_agboss.errors import ConfigurationError, StoreError
    from celery_agboss.runtime.settings import settings_from_conf
    from celery_agboss.store.deployment import check_place
    from celery_agboss.store.driver_errors import translated
    from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

    app = getattr(ctx.obj, "app", None)
    store = None
    try:
        settings = settings_from_conf(app.conf if app is not None else {})
        store = SQLAlchemyStore(settings.database_url)
        with translated(), store.read_transaction() as tx:
            check = check_place(tx.connection)
    except (ConfigurationError, StoreError) as exc:
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return False, {"checked": False, "why": why, "text": f"STORE not checked ({why})"}
    finally:
        if store is not None:
            store.close()
    found = {"checked": True, "copy": check.is_copy, "deployment_id": check.deployment_id}
    if check.is_copy:
        return True, found | {"text": f"STORE FAILED: {check.copy_warning()}"}
    return False, found | {"text": f"STORE passed: deployment id {check.deployment_id}"}


def _verdict(report: GatewayChecklistReport) -> str:
    """``passed`` never reads as every requirement proven: a skipped one is named (the
    command has no gateway clock, so the key-retention probe never runs here: check that
    retention in the gateway's docs, as its line says) (design: G3), and so is a warned
    one (money-safe, but every lost answer waits for an operator) (design: reconcile)."""
    from celery_agboss.testing.checklist import GatewayCheckStatus

    if not report.passed:
        return "FAILED"

    def named(status: GatewayCheckStatus) -> str:
        return ", ".join(r.requirement for r in report.results if r.status is status)

    notes = ["passed"]
    if skipped := named(GatewayCheckStatus.SKIPPED):
        notes.append(f"{skipped} not probed (no gateway clock)")
    if warned := named(GatewayCheckStatus.WARNED):
        notes.append(f"{warned} warned (read its line)")
    return ", ".join(notes)
