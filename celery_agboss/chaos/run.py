"""One explorer run: set up, throw faults while orders arrive, wait for quiet, count.

Phases, each bounded: start (the gateway, the app, the store's tables, the workers
and the beat, until each says it is ready); chaos (orders published at a steady pace
while the seeded faults fire, until both are done or ``--fault-seconds`` plus a margin
passed); quiet (no more faults; dead workers restarted; until every order is settled
or ``--quiet-seconds`` passed, then once more after a lease's length, so a late
effect is seen); the verdict. Whatever happens, every process started is ended by
pid, the run's queues are deleted, and the run directory is removed unless something
in it is worth a look.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, TextIO

from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import Engine

from celery_agboss.chaos.fault_injector import FaultRunner
from celery_agboss.chaos.options import (
    EXIT_COULD_NOT_RUN,
    EXIT_INTERRUPTED,
    EXIT_MONEY_WRONG,
    EXIT_OK,
    ChaosOptions,
    CouldNotRun,
    parse,
)
from celery_agboss.chaos.schedule import plan
from celery_agboss.chaos.services import check_broker, check_store, clean_broker
from celery_agboss.chaos.shop import (
    APP_MODULE,
    SPEEDUPS,
    ShopConfig,
    orders_table_ddl,
    write_app,
)
from celery_agboss.chaos.supervisor import Supervisor
from celery_agboss.chaos.verdict import WAITING, Execution, Verdict, settled, summarise
from celery_agboss.errors import PublishRefusedError
from celery_agboss.runtime.settings import redact_url
from celery_agboss.store.migrate import migrate
from celery_agboss.store.schema_executions import executions
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayCapabilities, GatewayRequestOutcome

START_SECONDS = 120.0  # every worker and the beat ready (a loaded machine is slow)
CHAOS_MARGIN_SECONDS = 60.0  # past --fault-seconds, faults still unfired are skipped
TICK_SECONDS = 0.1
PUBLISH_AGAIN_SECONDS = 1.0  # a refused publish (nothing sent) is placed again after this
POLL_SECONDS = 0.5

STRICT = GatewayCapabilities(
    # Every request is processed: a second send under one key is a second payment, so
    # a resend the library should not have made shows as money, not as a log line.
    idempotency_keys=False,
    lookup_by_key=True,
    first_response_on_repeat=False,
    conflict_on_mismatch=False,
    reference_lookup=True,
)


class Interrupted(BaseException):
    """SIGTERM or SIGINT reached the explorer (a BaseException, so that no ``except
    Exception`` on the way, a publish's included, takes it for an error to handle)."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    """Cleanup is under way: a second signal changes nothing (a Python handler, not
    ``SIG_IGN``, so no process started meanwhile inherits an ignored signal)."""


class Explorer:
    def __init__(self, options: ChaosOptions, environ: Mapping[str, str], out: TextIO) -> None:
        self.options = options
        self.out = out
        self.run_id = secrets.token_hex(4)
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"agboss-chaos-{self.run_id}-"))
        self.database_url = options.database_url or f"sqlite:///{self.run_dir / 'chaos.db'}"
        self.server = FakeGatewayServer(FakeGateway(capabilities=STRICT, hold_timeout=60.0))
        self.supervisor = Supervisor(self.run_dir, environ)
        self.config: ShopConfig | None = None
        self.app: ModuleType | None = None
        self.engine: Engine | None = None
        self.orders: dict[int, str] = {}
        self.not_placed: list[int] = []  # given up on: judged by no witness, so counted
        self.started_at = time.monotonic()
        self.keep = options.keep

    def say(self, line: str) -> None:
        elapsed = time.monotonic() - self.started_at
        print(f"[{elapsed:6.1f}s] {line}", file=self.out, flush=True)

    # --- phases ------------------------------------------------------------------------------

    def preflight(self) -> None:
        check_broker(self.options.broker)
        check_store(self.database_url)

    def start(self) -> None:
        self.server.start()
        self.config = ShopConfig(
            run_id=self.run_id,
            broker_url=self.options.broker,
            database_url=self.database_url,
            gateway_url=self.server.url,
            pseudonym_key=secrets.token_hex(32),
            speedups=SPEEDUPS,
        )
        write_app(self.run_dir, self.config)
        migrate(self.database_url)
        self.engine = create_engine(self.database_url)
        with self.engine.begin() as conn:
            conn.execute(text(orders_table_ddl(self.config)))
        sys.path.insert(0, str(self.run_dir))
        sys.modules.pop(APP_MODULE, None)
        self.app = importlib.import_module(APP_MODULE)
        self.say(f"run directory {self.run_dir}; gateway (fake) at {self.server.url}")
        processes = [self.supervisor.start_beat()]
        processes += [self.supervisor.start_worker(n) for n in range(self.options.workers)]
        deadline = time.monotonic() + START_SECONDS
        for process in processes:
            while not self.supervisor.ready(process):
                if not process.running:
                    self.keep = True
                    raise CouldNotRun(
                        f"{process.name} exited ({process.popen.returncode}) before it was "
                        f"ready; its log ({process.log_path}) ends:\n{process.tail()}"
                    )
                if time.monotonic() > deadline:
                    self.keep = True
                    raise CouldNotRun(
                        f"{process.name} was not ready after {START_SECONDS:.0f} s; its log "
                        f"({process.log_path}) ends:\n{process.tail()}"
                    )
                time.sleep(TICK_SECONDS)
        self.say(
            f"ready: `{' '.join(processes[0].argv)}` and {self.options.workers} of "
            f"`{' '.join(processes[1].argv)}` (chaos1 … chaos{self.options.workers})"
        )

    def chaos(self) -> FaultRunner:
        options = self.options
        settings = SPEEDUPS
        runner = FaultRunner(
            self.supervisor, self.server, float(settings["agboss_lease_ttl"]), self.say
        )
        faults = plan(
            options.seed,
            options.kinds,
            options.max_faults,
            options.fault_seconds,
            options.workers,
            first=options.first_fault,
        )
        self.say(
            f"{len(faults)} faults planned over {options.fault_seconds:g} s: "
            + ", ".join(f"{f.at:g}s {f.kind.value}" for f in faults)
        )
        publish_window = options.fault_seconds * 0.9
        due = [(publish_window * i / options.orders, i + 1) for i in range(options.orders)]
        t0 = time.monotonic()
        bound = t0 + options.fault_seconds + CHAOS_MARGIN_SECONDS
        pending = list(faults)
        assert self.app is not None
        charge_order: Any = self.app.charge_order
        while due or pending or not runner.settled:
            now = time.monotonic()
            elapsed = now - t0
            while due and due[0][0] <= elapsed:
                _, order = due.pop(0)
                try:
                    self.orders[order] = str(charge_order.delay(order).id)
                except PublishRefusedError as refused:
                    # Nothing was published (the store could not record it, e.g. SQLite
                    # locked by a frozen worker): the customer's click failed visibly,
                    # and a customer clicks again. The faults' timers run first: the
                    # worker that holds the store may be one this explorer froze.
                    again = time.monotonic() < bound
                    self.say(
                        f"order {order}: publish refused ({type(refused.__cause__).__name__}); "
                        + ("placed again in 1 s" if again else "not placed")
                    )
                    if again:
                        due.append((elapsed + PUBLISH_AGAIN_SECONDS, order))
                        due.sort()
                    else:
                        self.not_placed.append(order)
                    break
            runner.tick(now)
            if pending and not runner.busy and pending[0].at <= elapsed:
                runner.fire(pending.pop(0), now)
            if now > bound and pending:
                for fault in pending:
                    runner.skipped[fault.kind.value] += 1
                self.say(f"chaos bound reached: {len(pending)} faults skipped")
                pending.clear()
            if now > bound + CHAOS_MARGIN_SECONDS:
                self.say("faults still unsettled at the bound; thawing everything")
                runner.finish()
                runner.tick(now)
                break
            time.sleep(TICK_SECONDS)
        if due:  # left at the bound: never placed, and counted as such
            self.not_placed.extend(order for _, order in due)
            self.say(f"{len(due)} orders left unpublished at the bound: not placed")
        runner.disarm_gateway()
        self.say(f"faults done ({sum(runner.injected.values())} injected); waiting for quiet")
        return runner

    def quiet(self, runner: FaultRunner) -> bool:
        deadline = time.monotonic() + self.options.quiet_seconds
        lease = float(SPEEDUPS["agboss_lease_ttl"])
        confirmed_at: float | None = None
        while True:
            now = time.monotonic()
            runner.tick(now)
            outcomes = self.outcomes()
            unsettled = [o for o in outcomes if not settled(o)]
            if unsettled:
                confirmed_at = None
            elif confirmed_at is None:
                confirmed_at = now + lease  # once more after a lease: a late effect shows
            elif now >= confirmed_at:
                self.say("quiet: every order is paid, declined or waiting for an operator")
                return True
            if now >= deadline:
                self.say(
                    f"not quiet after {self.options.quiet_seconds:g} s: "
                    f"{len(unsettled)} orders unsettled"
                )
                return False
            time.sleep(POLL_SECONDS)

    # --- reading the witnesses -----------------------------------------------------------------

    def _rows(self) -> dict[str, tuple[str, str | None]]:
        assert self.engine is not None and self.config is not None
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(f"SELECT order_id, status, payment FROM {self.config.orders_table}")
            ).all()
        return {str(r[0]): (str(r[1]), None if r[2] is None else str(r[2])) for r in rows}

    def _executions(self) -> dict[str, Execution]:
        assert self.engine is not None
        ids = list(self.orders.values())
        found: dict[str, Execution] = {}
        with self.engine.connect() as conn:
            for start in range(0, len(ids), 200):
                chunk = ids[start : start + 200]
                rows = conn.execute(
                    select(executions.c.id, executions.c.state, executions.c.reason).where(
                        executions.c.id.in_(chunk)
                    )
                ).all()
                found.update({str(r[0]): Execution(str(r[1]), r[2]) for r in rows})
        return found

    def outcomes(self) -> list[Any]:
        gateway = self.server.gateway
        return summarise(
            self.orders,
            gateway.payments,
            [d.reference for d in self.server.declines],
            self._rows(),
            self._executions(),
        )

    def verdict(self, runner: FaultRunner, quiet: bool) -> Verdict:
        gateway = self.server.gateway
        requests = gateway.requests
        outcomes = self.outcomes()
        ours = {f"order:{o}" for o in self.orders}
        stray = [p for p in gateway.payments if p.get("reference") not in ours]
        notes = []
        if not quiet:
            notes.append(
                f"\nnot quiet within --quiet-seconds {self.options.quiet_seconds:g}: the "
                "orders still unsettled count as lost"
            )
        if stray:
            listed = ", ".join(f"{p['id']} ({p.get('reference')})" for p in stray[:10])
            more = f" and {len(stray) - 10} more" if len(stray) > 10 else ""
            notes.append(f"\npayments at the gateway for no order of this run: {listed}{more}")
        if self.not_placed:
            orders = ", ".join(str(o) for o in sorted(self.not_placed))
            notes.append(f"\nnot placed (every publish refused until the bound): orders {orders}")
        return Verdict(
            seed=self.options.seed,
            orders=outcomes,
            phantom_refunds=len(gateway.refunds),
            faults=dict(runner.injected),
            skipped_faults=dict(runner.skipped),
            duration_seconds=time.monotonic() - self.started_at,
            gateway={
                "charge requests": len(requests) + len(self.server.declines),
                "payments": len(gateway.payments),
                "answers dropped": sum(
                    1
                    for r in requests
                    if r.outcome is GatewayRequestOutcome.PROCESSED and not r.answered
                ),
                "failed before processing": sum(
                    1 for r in requests if r.outcome is GatewayRequestOutcome.NOT_PROCESSED
                ),
                "declines": len(self.server.declines),
                "lookups": len(gateway.lookups),
            },
            settings={
                "store": self.options.store,
                "broker": _sanitized(self.options.broker),
                "workers": self.options.workers,
                **{k: f"{v:g}s" for k, v in SPEEDUPS.items()},
            },
            stray_payments=len(stray),
            not_placed=len(self.not_placed),
            orders_requested=self.options.orders,
            notes=notes,
        )

    def inspect_command(self) -> str:
        return f"cd {self.run_dir} && {' '.join(self.supervisor.command('agboss', 'show'))}"

    # --- the end ---------------------------------------------------------------------------

    def close(self) -> None:
        try:
            self.supervisor.stop_all()
        finally:
            self.server.stop()
            if self.config is not None:
                for problem in clean_broker(self.config):
                    self.say(problem)
            if self.app is not None:
                with contextlib.suppress(Exception):
                    self.app.app.close()
                sys.modules.pop(APP_MODULE, None)
            if str(self.run_dir) in sys.path:
                sys.path.remove(str(self.run_dir))
            if self.engine is not None:
                self.engine.dispose()
            if self.keep:
                self.say(f"run directory kept: {self.run_dir} (logs in {self.run_dir / 'logs'})")
            else:
                shutil.rmtree(self.run_dir, ignore_errors=True)


def _sanitized(url: str) -> str:
    try:
        from kombu.utils.url import maybe_sanitize_url

        return str(maybe_sanitize_url(url))
    except Exception:
        return url.split("@")[-1]


def header(options: ChaosOptions) -> str:
    store = (
        "SQLite (a new file in the run directory)"
        if options.database_url is None
        else redact_url(options.database_url)
    )
    return "\n".join(
        [
            f"chaos explorer: seed {options.seed} (replay with --seed {options.seed})",
            f"  {options.orders} orders, {options.workers} workers, store {store}, "
            f"broker {_sanitized(options.broker)}",
            f"  faults: at most {options.max_faults} of "
            + ",".join(k.value for k in options.kinds)
            + f" within {options.fault_seconds:g} s; quiet within {options.quiet_seconds:g} s",
            "  speed-ups (documented settings): "
            + ", ".join(f"{k}={v:g}s" for k, v in SPEEDUPS.items()),
            "  the gateway is a fake on 127.0.0.1 that does not deduplicate keys: "
            "a second send is a second payment",
        ]
    )


def exit_code(verdict: Verdict) -> int:
    """Wrong money first; a run that placed not every order (or none) did not run as asked,
    so its OK would speak for orders it never judged."""
    if not verdict.ok:
        return EXIT_MONEY_WRONG
    if not verdict.complete:
        return EXIT_COULD_NOT_RUN
    return EXIT_OK


def run(
    options: ChaosOptions,
    *,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
) -> int:
    """One run; the exit code (see the package docstring)."""
    stream = sys.stdout if out is None else out
    print(header(options), file=stream, flush=True)
    explorer = Explorer(options, os.environ if environ is None else environ, stream)
    previous = _install(_interrupt)
    try:
        explorer.preflight()
        explorer.start()
        runner = explorer.chaos()
        try:
            quiet = explorer.quiet(runner)
        finally:
            runner.finish()
        verdict = explorer.verdict(runner, quiet)
        if verdict.of(WAITING) or not verdict.ok or not verdict.complete:
            explorer.keep = True
        print("", file=stream)
        print(verdict.render(explorer.inspect_command()), file=stream, flush=True)
        if options.json_path:
            Path(options.json_path).write_text(json.dumps(verdict.as_json(), indent=2) + "\n")
        return exit_code(verdict)
    except CouldNotRun as exc:
        print(f"chaos explorer: could not run: {exc}", file=sys.stderr, flush=True)
        return EXIT_COULD_NOT_RUN
    except (Interrupted, KeyboardInterrupt):
        print("chaos explorer: interrupted; stopping every process it started", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        explorer.keep = True
        print(
            "chaos explorer: could not run: an unexpected error\n" + traceback.format_exc(),
            file=sys.stderr,
            flush=True,
        )
        return EXIT_COULD_NOT_RUN
    finally:
        # A second Ctrl-C or SIGTERM while it cleans up would escape as an uncaught
        # exception (exit 1, read as "money wrong") and leave processes behind.
        _install(_already_stopping)
        try:
            explorer.close()
        finally:
            _install(previous)


Handler = Callable[[int, FrameType | None], Any] | int | None


def _install(handler: Any) -> dict[int, Handler]:
    """Install ``handler`` for SIGTERM and SIGINT (a dict restores what was there)."""
    previous: dict[int, Handler] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        wanted = handler.get(signum) if isinstance(handler, dict) else handler
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            previous[signum] = signal.signal(
                signum, wanted if wanted is not None else signal.SIG_DFL
            )
    return previous


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    return run(options)


__all__ = ["exit_code", "header", "main", "run"]
