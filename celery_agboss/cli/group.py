"""The ``agboss`` group of Celery's CLI, and what every one of its commands shares.

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

import json
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from celery_agboss.errors import ConfigurationError, OperatorRefusedError, StoreError

if TYPE_CHECKING:
    from celery_agboss.app import AGBoss

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


GENERIC_COMMAND = "celery -A proj "
"""How messages written without an app name a command (docs, the operator API)."""


def app_command() -> str:
    """``celery -A <what this command was given> ``: the hints then name the user's own
    app (``celery -A shop agboss resolve …``), not the docs' ``proj``."""
    ctx = click.get_current_context(silent=True)
    given = ctx.find_root().params.get("app") if ctx is not None else None
    if isinstance(given, str) and given.strip():
        return f"celery -A {shlex.quote(given.strip())} "
    app = getattr(getattr(ctx, "obj", None), "app", None)
    main = getattr(app, "main", None)
    if isinstance(main, str) and main and main != "__main__":
        return f"celery -A {shlex.quote(main)} "
    return GENERIC_COMMAND


def named_for_this_app(text: str) -> str:
    """``text`` with each ``celery -A proj `` naming this command's app instead."""
    command = app_command()
    return text if command == GENERIC_COMMAND else text.replace(GENERIC_COMMAND, command)


class CommandOutput:
    """Where a command writes: people's text or one JSON document. Either way a command
    a message names is this app's (``named_for_this_app``)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def emit(self, data: Any, text: str | Callable[[], str]) -> None:
        if self.as_json:
            click.echo(named_for_this_app(json.dumps(data, indent=2, sort_keys=True, default=str)))
        else:
            click.echo(named_for_this_app(text() if callable(text) else text))

    def fail(self, code: int, kind: str, message: str) -> NoReturn:
        message = named_for_this_app(message)
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
def open_runtime(ctx: click.Context, out: CommandOutput) -> Iterator[AGBoss]:
    """The app's runtime (its ``AGBoss``), its store closed after the command;
    configuration and store trouble become exit code 4 with the message that says
    what to set."""
    from celery_agboss.app import AGBoss

    runtime: AGBoss | None = None
    try:
        runtime = AGBoss.of(_celery_app(ctx))
        runtime.settings  # noqa: B018 - refuses a wrong configuration now, with its reason
        yield runtime
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
        if runtime is not None:
            runtime.close()


def json_command(fn: F) -> F:
    """Every subcommand gets ``--json``."""
    return json_option(fn)


# --- the group ------------------------------------------------------------------------


_JSON_ASKED = "celery_agboss.cli.json"


class _AGBossGroup(click.Group):
    """The group whose usage errors (a bad ``--state``, ``--batch-size 0``, an unknown
    option) keep the ``--json`` promise: a script parsing the output gets the failure
    document every command writes, with click's exit code 2, not click's text."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        options = args[: args.index("--")] if "--" in args else args
        ctx.meta[_JSON_ASKED] = "--json" in options
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            if not ctx.meta.get(_JSON_ASKED):
                raise
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            CommandOutput(True).fail(
                EXIT_USAGE, "usage", f"{exc.format_message()} (see `{where} --help`)"
            )


@click.group(name="agboss", cls=_AGBossGroup)
@click.pass_context
def agboss(ctx: click.Context) -> None:
    """celery_agboss: payments waiting for an operator, resolve, cancel, the sweep."""


__all__ = [
    "EXIT_CONFIGURATION",
    "EXIT_NOT_FOUND",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "CommandOutput",
    "actor_option",
    "agboss",
    "json_command",
    "open_runtime",
    "reason_option",
]
