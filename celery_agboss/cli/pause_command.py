"""``celery -A proj agboss answer-pause PAUSE_ID ANSWER``: answer a pause from a shell.

The same verb as ``celery_agboss.answer_pause`` (one answer wins, whoever else answers
at the same time), with the operator in the audit trail. ``ANSWER`` is JSON; what is
not JSON is taken as a string, so ``approve`` and ``'"approve"'`` say the same.
"""

from __future__ import annotations

import json
from typing import Any

import click

from celery_agboss.cli.group import (
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    CommandOutput,
    actor_option,
    agboss,
    json_command,
    open_runtime,
)
from celery_agboss.errors import NotPausedError


def _parse_answer(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


@agboss.command(name="answer-pause")
@click.argument("pause_id")
@click.argument("answer")
@actor_option
@json_command
@click.pass_context
def answer_pause(
    ctx: click.Context, pause_id: str, answer: str, actor: str | None, as_json: bool
) -> None:
    """Answer a pause (as `agboss pauses` lists it) once; its task runs again. A pause not
    reached yet is answered early: kept for it."""
    from celery_agboss.operator import answer_pause_outcome
    from celery_agboss.operator.common import default_actor

    out = CommandOutput(as_json)
    with open_runtime(ctx, out) as runtime:
        try:
            outcome = answer_pause_outcome(
                runtime, pause_id, _parse_answer(answer), actor=actor or default_actor()
            )
        except NotPausedError as exc:
            if getattr(exc, "found", True):
                out.fail(EXIT_REFUSED, "not-paused", str(exc))
            out.fail(EXIT_NOT_FOUND, "not-found", f"{exc}; list them with `agboss pauses`")
        if outcome.early:
            text = (
                f"Answered {pause_id} before its task reached the pause; kept for it: a "
                "pause with accept_early=True takes it when it gets there."
            )
        elif outcome.republished:
            text = f"Answered {pause_id}; its task is published again now."
        else:
            text = (
                f"Answered {pause_id}; its task is published again when the delivery that "
                "paused lets go, or by the sweep."
            )
        out.emit(
            {
                "pause_id": pause_id,
                "answered": True,
                "early": outcome.early,
                "republished": outcome.republished,
            },
            text,
        )
