"""The explorer's command line, checked before anything starts."""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from celery_agboss.chaos.schedule import DEFAULT_KINDS, FaultKind, parse_kinds
from celery_agboss.core.durations import to_seconds

EXIT_OK = 0
EXIT_MONEY_WRONG = 1
EXIT_COULD_NOT_RUN = 2
EXIT_INTERRUPTED = 130

DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
DEFAULT_ORDERS = 200
DEFAULT_WORKERS = 3


class CouldNotRun(Exception):
    """The explorer cannot run as asked; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class ChaosOptions:
    orders: int
    seed: int
    store: str  # "sqlite" or "postgres"
    database_url: str | None  # None: a SQLite file in the run directory
    broker: str
    workers: int
    kinds: tuple[FaultKind, ...]
    max_faults: int
    fault_seconds: float
    quiet_seconds: float
    first_fault: FaultKind | None
    json_path: str | None
    keep: bool


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """Usage errors exit with the explorer's "could not run" code."""
        self.print_usage()
        self.exit(EXIT_COULD_NOT_RUN, f"{self.prog}: could not run: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m celery_agboss.chaos",
        description=(
            "Throw random faults at a generated shop running on real Celery workers against "
            "your broker and store (always with a fake gateway on 127.0.0.1), then count "
            "the money. Exit 0: every order placed, none paid twice or lost (a wrong "
            "payment included), no phantom refund, no payment for no order; 1: the money "
            "is wrong; 2: could not run, or not every order was placed."
        ),
    )
    p.add_argument("--orders", type=int, default=DEFAULT_ORDERS, help="orders to charge (200)")
    p.add_argument("--seed", type=int, default=None, help="replay a schedule (printed at start)")
    p.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    p.add_argument(
        "--database-url",
        default=None,
        help="the store: postgresql+psycopg://… (default $AGBOSS_DATABASE_URL) for postgres, "
        "an absolute sqlite:////… for sqlite (default: a new file in the run directory); "
        "use a database of its own",
    )
    p.add_argument("--broker", default=DEFAULT_BROKER, help=f"broker URL ({DEFAULT_BROKER})")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="celery workers (3)")
    p.add_argument(
        "--faults",
        default=None,
        help="comma-separated fault kinds, or all (default: "
        + ",".join(k.value for k in DEFAULT_KINDS)
        + ")",
    )
    p.add_argument("--max-faults", type=int, default=None, help="default: orders / 5, at least 4")
    p.add_argument(
        "--fault-seconds",
        type=float,
        default=None,
        help="faults and new orders stop after this (default: orders / 2, at least 20)",
    )
    p.add_argument(
        "--quiet-seconds",
        type=float,
        default=180.0,
        help="then wait at most this long for every order to settle (180)",
    )
    p.add_argument("--first-fault", default=None, help="force the first fault's kind")
    p.add_argument("--json", dest="json_path", default=None, help="also write the verdict here")
    p.add_argument("--keep", action="store_true", help="keep the run directory and its logs")
    return p


def parse(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> ChaosOptions:
    """The options, or SystemExit(2) with argparse's message (``CouldNotRun`` for values)."""
    env = os.environ if environ is None else environ
    p = parser()
    args = p.parse_args(argv)
    try:
        return _checked(args, env)
    except (CouldNotRun, ValueError) as exc:
        p.error(str(exc))
        raise AssertionError("unreachable") from None


def _positive_seconds(value: float, flag: str) -> float:
    """A bound the run can reach: ``nan`` passes every comparison and ``inf`` never
    comes, so either would run for ever (``to_seconds`` refuses both)."""
    seconds = to_seconds(value, what=flag)
    if seconds <= 0:
        raise CouldNotRun(f"{flag} must be a positive number of seconds, not {value}")
    return seconds


def _checked(args: argparse.Namespace, env: Mapping[str, str]) -> ChaosOptions:
    if args.orders < 1:
        raise CouldNotRun(f"--orders must be at least 1, not {args.orders}")
    if args.workers < 1:
        raise CouldNotRun(f"--workers must be at least 1, not {args.workers}")
    kinds = DEFAULT_KINDS if args.faults is None else parse_kinds(args.faults)
    first = None if args.first_fault is None else parse_kinds(args.first_fault)[0]
    max_faults = max(4, args.orders // 5) if args.max_faults is None else args.max_faults
    if max_faults < 0:
        raise CouldNotRun(f"--max-faults must be zero or more, not {max_faults}")
    fault_seconds = max(20.0, args.orders / 2) if args.fault_seconds is None else args.fault_seconds
    fault_seconds = _positive_seconds(fault_seconds, "--fault-seconds")
    quiet_seconds = _positive_seconds(args.quiet_seconds, "--quiet-seconds")
    database_url = args.database_url
    if args.store == "postgres":
        database_url = database_url or env.get("AGBOSS_DATABASE_URL") or None
        if not database_url:
            raise CouldNotRun(
                "--store postgres needs a database: pass --database-url "
                "postgresql+psycopg://user@host/chaos (or set AGBOSS_DATABASE_URL), "
                "a database of its own"
            )
        if not database_url.startswith("postgresql"):
            raise CouldNotRun(
                "--store postgres needs a postgresql+psycopg:// URL, "
                f"not {database_url.split(':')[0]}:…"
            )
    elif database_url is not None and not database_url.startswith("sqlite:////"):
        raise CouldNotRun("--store sqlite takes an absolute sqlite:////path/file.db URL")
    if not args.broker.startswith(("redis://", "rediss://", "amqp://", "amqps://", "pyamqp://")):
        raise CouldNotRun(
            f"--broker {args.broker.split(':')[0]}:… is not a Redis or RabbitMQ URL "
            "(redis://host:6379/0, amqp://user:password@host:5672//)"
        )
    seed = random.SystemRandom().randrange(2**31) if args.seed is None else args.seed
    return ChaosOptions(
        orders=args.orders,
        seed=seed,
        store=args.store,
        database_url=database_url,
        broker=args.broker,
        workers=args.workers,
        kinds=kinds,
        max_faults=max_faults,
        fault_seconds=fault_seconds,
        quiet_seconds=quiet_seconds,
        first_fault=first,
        json_path=args.json_path,
        keep=args.keep,
    )


__all__ = [
    "EXIT_COULD_NOT_RUN",
    "EXIT_INTERRUPTED",
    "EXIT_MONEY_WRONG",
    "EXIT_OK",
    "ChaosOptions",
    "CouldNotRun",
    "parse",
]
