"""``python -m example_project.scenarios [ps1 …] [--unprotected | --protected]``: run the table.

With no ids, every scenario; each is run twice, with the plain-Celery twin and with the
shop's ``PaymentTask``s (``--unprotected`` or ``--protected`` runs one column only), on
real worker processes, and the run ends with the table. By default the store is an
SQLite file and the broker kombu's filesystem transport, both in a temporary directory
(``--data-dir`` keeps them); ``--broker-url redis://…`` and ``--database-url
postgresql+psycopg://…`` run the same on Redis and PostgreSQL. Exit status 1 when a
protected row missed its bar, or a scenario could not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from example_project.scenarios.catalog import SCENARIOS, Outcome
from example_project.scenarios.world import SPEED_UPS, WORKER_LOST_WAIT_SECONDS, World

DEFAULT_JOBS = 3
SIDE_BY_SIDE_LIMIT_SECONDS = 1200.0

MODULES = (
    "example_project.scenarios.crashes",
    "example_project.scenarios.duplicates",
    "example_project.scenarios.gateway_side",
    "example_project.scenarios.sagas",
)

TITLES = {
    "ps1": "A retry after a timeout",
    "ps2": "A crash after the charge, before the checkpoint",
    "ps3": "A zombie after a takeover",
    "ps4": "The zombie reaches the write first",
    "ps5": "A crash after the send, before the answer",
    "ps6": "Support levels: full, no lookup, no keys",
    "ps7": "The model calls the charge tool twice",
    "ps8": "Two executions for one order",
    "ps9": "Parallel branches charging one aggregate",
    "ps10": "A saga: a charge and its refund, replayed or interrupted",
    "ps11": "A pause answered twice",
    "ps12": "A rolling deploy or a graceful stop mid-payment",
    "ps13": "Clock skew and lease expiry",
    "ps14": "The database lost mid-commit",
    "ps15": "A webhook delivered twice",
    "ps16": "Webhooks out of order",
    "ps17": "The idempotency key expires before a retry",
    "ps18": "A partial capture",
    "ps19": "A refund retried",
    "ps20": "A void and a capture race",
    "ps21": "A redirect or 3DS flow: the browser retries",
    "ps22": "A retry with another card after a decline",
    "ps23": "Two requests under one key at once",
}


def _load() -> None:
    for module in MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as missing:
            if missing.name != module:
                raise


def _reachable(url: str, what: str, setting: str) -> None:
    """Fail early, naming the setting, when a service in ``url`` does not answer."""
    parts = urlsplit(url)
    if not parts.hostname:
        return
    default = {"redis": 6379, "amqp": 5672, "postgresql": 5432}
    port = parts.port or default.get(parts.scheme.split("+")[0], 0)
    try:
        with socket.create_connection((parts.hostname, port), timeout=3):
            return
    except OSError as exc:
        raise SystemExit(
            f"{what} at {parts.hostname}:{port} does not answer ({exc}): check {setting}"
            f" ({'BROKER_URL' if 'broker' in setting else 'DATABASE_URL'}= with make demo)"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m example_project.scenarios")
    parser.add_argument("ids", nargs="*", help="ps1 … ps23 (all when none)")
    column = parser.add_mutually_exclusive_group()
    column.add_argument("--unprotected", action="store_true", help="the plain-Celery column only")
    column.add_argument("--protected", action="store_true", help="the celery_agboss column only")
    parser.add_argument(
        "--broker-url", help="a broker URL (default: the embedded filesystem transport)"
    )
    parser.add_argument(
        "--database-url", help="the store's database URL (default: SQLite in the data dir)"
    )
    parser.add_argument("--results", type=Path, help="also write the table as JSON to this file")
    parser.add_argument(
        "--data-dir", type=Path, help="keep the run's files here (default: a temporary directory)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        help="worlds run side by side, each with its own workers (default: 3 on the embedded "
        "default, 1 with --broker-url or --database-url, whose queues and tables they would share)",
    )
    parser.add_argument("--no-table", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ids = [name.lower() for name in args.ids] or list(TITLES)
    unknown = [name for name in ids if name not in TITLES]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}: one of ps1 … ps23")
    if args.broker_url:
        _reachable(args.broker_url, "the broker", "--broker-url")
    if args.database_url:
        _reachable(args.database_url, "the database", "--database-url")
    _load()
    columns = [False] if args.unprotected else [True] if args.protected else [False, True]
    shared = bool(args.broker_url or args.database_url)
    jobs = args.jobs if args.jobs is not None else (1 if shared else DEFAULT_JOBS)
    if jobs < 1:
        parser.error("--jobs must be at least 1")
    jobs = min(jobs, len(ids))
    run = _run if jobs == 1 else functools.partial(_run_side_by_side, jobs=jobs)
    if args.data_dir is not None:
        args.data_dir.mkdir(parents=True, exist_ok=True)
        return run(args.data_dir.resolve(), ids, columns, args)
    with tempfile.TemporaryDirectory(prefix="agboss-shop-") as directory:
        return run(Path(directory), ids, columns, args)


def _header(root: Path, args: argparse.Namespace) -> None:
    speed = ", ".join(f"{name}={value}" for name, value in SPEED_UPS.items())
    print(
        f"example shop: store {args.database_url or 'SQLite in ' + str(root)}, broker "
        f"{args.broker_url or 'kombu filesystem transport in ' + str(root / 'broker')}"
    )
    speed += f", Celery's worker_lost_wait={WORKER_LOST_WAIT_SECONDS:g}"
    print(f"short timings for the demo (a deployment keeps the defaults): {speed}", flush=True)


def _run_side_by_side(
    root: Path, ids: list[str], columns: list[bool], args: argparse.Namespace, *, jobs: int
) -> int:
    """``jobs`` runners, each on its own world (data directory, workers, beat, fake
    gateway), the scenarios dealt out in turn; a progress line as each one ends."""
    _header(root, args)
    print(f"{jobs} worlds side by side, each with 2 workers and beat\n", flush=True)
    started = time.monotonic()
    flag = ["--unprotected"] if columns == [False] else ["--protected"] if columns == [True] else []
    runners = []
    for number in range(1, jobs + 1):
        part = ids[number - 1 :: jobs]
        log, results = root / f"world-{number}.log", root / f"world-{number}.json"
        argv = [sys.executable, "-m", "example_project.scenarios", *part, *flag, "--jobs", "1"]
        argv += ["--data-dir", str(root / f"world-{number}"), "--results", str(results)]
        argv.append("--no-table")
        with open(log, "wb") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        runners.append((popen, log, results, part))
    total, seen = len(ids) * len(columns), set[str]()
    try:
        deadline = time.monotonic() + SIDE_BY_SIDE_LIMIT_SECONDS
        while any(popen.poll() is None for popen, *_ in runners):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scenarios ran over {SIDE_BY_SIDE_LIMIT_SECONDS:.0f} s")
            ended = [
                line
                for _, log, _, _ in runners
                for line in log.read_text(errors="replace").splitlines()
                if line.startswith("    => ")
            ]
            for line in ended:
                if line not in seen:
                    seen.add(line)
                    elapsed = time.monotonic() - started
                    print(f"[{len(seen)}/{total} {elapsed:4.0f} s] {line.strip()}", flush=True)
            time.sleep(0.5)
    finally:
        for popen, *_ in runners:
            if popen.poll() is None:
                popen.send_signal(signal.SIGINT)  # each closes its world: no worker left
        for popen, *_ in runners:
            try:
                popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                popen.kill()
    results: dict[tuple[str, bool], Outcome | str] = {}
    for number, (popen, log, table, part) in enumerate(runners, 1):
        print(f"\n--- world {number}: {' '.join(part)} ---")
        print(log.read_text(errors="replace").rstrip())
        stored = json.loads(table.read_text()) if table.exists() else {}
        for name in part:
            for protected in columns:
                cell = (stored.get(name) or {}).get("protected" if protected else "unprotected")
                results[(name, protected)] = _from_json(cell, popen.returncode)
    return _report(ids, columns, results, args, started)


def _from_json(cell: dict[str, object] | None, returncode: int | None) -> Outcome | str:
    if cell is None:
        return f"did not run (its runner exited {returncode})"
    if not cell.get("ran"):
        return str(cell.get("text"))
    simulated = cell.get("simulated")
    return Outcome(
        str(cell["text"]), bool(cell["as_expected"]), None if simulated is None else str(simulated)
    )


def _run(root: Path, ids: list[str], columns: list[bool], args: argparse.Namespace) -> int:
    _header(root, args)
    started = time.monotonic()
    world = World(root, broker_url=args.broker_url, database_url=args.database_url)
    results: dict[tuple[str, bool], Outcome | str] = {}
    try:
        world.open()
        print(f"2 workers and beat up in {time.monotonic() - started:.0f} s\n")
        total, done = len(ids) * len(columns), 0
        for name in ids:
            for protected in columns:
                done += 1
                label = "protected" if protected else "unprotected"
                elapsed = time.monotonic() - started
                print(
                    f"[{done}/{total} {elapsed:5.0f} s] {name} {label}: {TITLES[name]}", flush=True
                )
                results[(name, protected)] = _one(world, name, protected, label)
    finally:
        world.close()
    return _report(ids, columns, results, args, started)


def _report(
    ids: list[str],
    columns: list[bool],
    results: dict[tuple[str, bool], Outcome | str],
    args: argparse.Namespace,
    started: float,
) -> int:
    if not args.no_table:
        _table(ids, columns, results)
    if args.results is not None:
        _write_results(args.results, ids, columns, results)
    print(f"\n{len(ids)} scenarios in {time.monotonic() - started:.0f} s")
    missed = [
        name
        for (name, protected), got in results.items()
        if protected and (not isinstance(got, Outcome) or not got.as_expected)
    ]
    broken = [name for (name, _), got in results.items() if not isinstance(got, Outcome)]
    if missed or broken:
        print(f"NOT AS EXPECTED: {', '.join(sorted(set(missed + broken)))}", file=sys.stderr)
        return 1
    return 0


def _one(world: World, name: str, protected: bool, label: str) -> Outcome | str:
    found = SCENARIOS.get(name)
    if found is None:
        print("    not built yet")
        return "not built yet"
    try:
        outcome = found.run(world, protected, lambda line: print(f"    {line}", flush=True))
    except Exception as exc:  # the table says which row broke, and why
        traceback.print_exc()
        print(f"    => {name} {label}: could not run: {type(exc).__name__}: {exc}", flush=True)
        return f"could not run: {type(exc).__name__}: {exc}"
    mark = "" if outcome.as_expected else "  (not as expected)"
    print(f"    => {name} {label}: {outcome.text}{mark}")
    return outcome


def _write_results(
    path: Path, ids: list[str], columns: list[bool], results: dict[tuple[str, bool], Outcome | str]
) -> None:
    def entry(got: Outcome | str | None) -> dict[str, object] | None:
        if got is None:
            return None
        if isinstance(got, str):
            return {"text": got, "as_expected": False, "ran": False, "simulated": None}
        return {**dataclasses.asdict(got), "ran": True}

    table = {
        name: {
            ("protected" if protected else "unprotected"): entry(results.get((name, protected)))
            for protected in columns
        }
        for name in ids
    }
    path.write_text(json.dumps(table, indent=2))


def _cell(got: Outcome | str | None, notes: list[str]) -> str:
    if got is None:
        return "-"
    if isinstance(got, str):
        return got
    text = got.text + ("" if got.as_expected else " (!)")
    if got.simulated:
        if got.simulated not in notes:
            notes.append(got.simulated)
        text += f" [{notes.index(got.simulated) + 1}]"
    return text


def _table(
    ids: list[str], columns: list[bool], results: dict[tuple[str, bool], Outcome | str]
) -> None:
    notes: list[str] = []
    rows = [
        (
            name,
            TITLES[name],
            _cell(results.get((name, False)), notes),
            _cell(results.get((name, True)), notes),
        )
        for name in ids
    ]
    head = ("scenario", "", "unprotected (plain Celery)", "protected (celery_agboss)")
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(4)]
    print()
    for row in [head, tuple("-" * w for w in widths), *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    for number, note in enumerate(notes, 1):
        print(f"[{number}] simulated: {note}")
    if any(isinstance(got, Outcome) and not got.as_expected for got in results.values()):
        print("(!) not as expected in this run")


if __name__ == "__main__":
    sys.exit(main())
