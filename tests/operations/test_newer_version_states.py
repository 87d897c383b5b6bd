"""An operator's verb on an execution in a state a newer version of the package wrote
(a rolling upgrade: this version does not know it).

Every verb (``cancel``, ``redrive``, ``accept``, ``unpark``, ``payments-handled``,
``resolve`` of one of its intents, ``answer-pause``) raised ValueError: a traceback and
a crash's exit code in the CLI, and ``resolve`` had already committed the intent's
settlement when it raised (a payment decision taken by a version that cannot read the
execution it sends on). Now each is refused as any operator refusal is
(``OperatorRefusedError``, ``wrong-state``, exit code 1), naming the state and what to
do, and nothing is written: no row, no history, no audit, no publish.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from celery_agboss import operator
from celery_agboss.cli.group import EXIT_REFUSED
from celery_agboss.errors import OperatorRefusedError
from celery_agboss.store.schema import intent_history, outbound_calls
from celery_agboss.store.schema_executions import audit, executions, pauses
from tests.operations.cli import run
from tests.operations.world import World
from tests.support.newer_states import FUTURE_STATE, write_raw_state


def _everything(world: World) -> dict[str, list[tuple[Any, ...]]]:
    """Every row an operator's verb could write, to compare before and after."""
    with world.agboss.store.engine.connect() as conn:
        return {
            table.name: sorted(tuple(row) for row in conn.execute(select(table)).all())
            for table in (executions, outbound_calls, intent_history, audit, pauses)
        }


def _a_newer_version_wrote(world: World, *, stranded: bool = False) -> tuple[str, str | None]:
    """An execution (with a pending intent when ``stranded``) a newer version's worker
    then moved to ``FUTURE_STATE``; its id and the intent's key."""
    execution_id = world.publish()
    key = world.strand(execution_id)[0] if stranded else None
    write_raw_state(world.agboss.store.engine, execution_id, FUTURE_STATE)
    return execution_id, key


Verb = Callable[[Any, str, str | None], Any]
Line = Callable[[str, str | None], list[str]]


def _with_a_reason(name: str, reason: str) -> tuple[Verb, Line]:
    """``name`` on an execution with ``reason``: in process, and its command line."""
    attribute = name.replace("-", "_")
    return (
        lambda app, e, _k: getattr(operator, attribute)(app, e, reason),
        lambda e, _k: [name, e, "--reason", reason],
    )


VERBS: dict[str, tuple[Verb, Line]] = {
    "cancel": _with_a_reason("cancel", "stop it"),
    "cancel --payments-handled": (
        lambda app, e, _k: operator.cancel(app, e, "refunded", payments_handled=True),
        lambda e, _k: ["cancel", e, "--payments-handled", "--reason", "refunded"],
    ),
    "redrive": _with_a_reason("redrive", "go on"),
    "accept": _with_a_reason("accept", "kept"),
    "unpark": _with_a_reason("unpark", "again"),
    "payments-handled": _with_a_reason("payments-handled", "refunded"),
    "answer-pause": (
        lambda app, e, _k: operator.answer_pause(app, f"{e}:approve", {"ok": True}),
        lambda e, _k: ["answer-pause", f"{e}:approve", '{"ok": true}'],
    ),
    "resolve --not-sent": (
        lambda app, _e, k: operator.resolve(app, str(k), reason="not there", not_sent=True),
        lambda _e, k: ["resolve", str(k), "--not-sent", "--reason", "not there"],
    ),
    "resolve --completed": (
        lambda app, _e, k: operator.resolve(
            app, str(k), reason="found it", completed={"id": "ch_1", "status": "succeeded"}
        ),
        lambda _e, k: [
            "resolve",
            str(k),
            "--completed",
            '{"id": "ch_1", "status": "succeeded"}',
            "--reason",
            "found it",
        ],
    ),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_an_operator_verb_on_a_newer_versions_state_is_refused_and_writes_nothing(
    world: World, verb: str
) -> None:
    act, _ = VERBS[verb]
    execution_id, key = _a_newer_version_wrote(world, stranded=verb.startswith("resolve"))
    before, published = _everything(world), list(world.published)
    requests = len(world.gateway.requests)

    with pytest.raises(OperatorRefusedError) as refused:
        act(world.app, execution_id, key)

    assert getattr(refused.value, "code", None) == "wrong-state"
    message = str(refused.value)
    assert FUTURE_STATE in message and execution_id in message
    assert "newer version of celery_agboss" in message and "on that version" in message
    assert _everything(world) == before
    assert world.published == published
    assert len(world.gateway.requests) == requests


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_the_command_of_a_verb_on_a_newer_versions_state_exits_refused(
    world: World, verb: str
) -> None:
    _, argv = VERBS[verb]
    execution_id, key = _a_newer_version_wrote(world, stranded=verb.startswith("resolve"))
    before = _everything(world)

    result = run(world.app, *argv(execution_id, key))

    assert result.exit_code == EXIT_REFUSED, result.output
    assert FUTURE_STATE in result.output and "newer version" in result.output
    assert "Traceback" not in result.output
    assert _everything(world) == before


def test_a_verb_on_a_known_state_is_not_taken_for_a_newer_versions(world: World) -> None:
    """The refusal is for a state this version does not know only: a known one that
    no verb takes keeps its own refusal."""
    execution_id = world.publish()

    with pytest.raises(OperatorRefusedError) as refused:
        operator.redrive(world.app, execution_id, "go on")

    assert "newer version" not in str(refused.value)
    assert "REQUESTED" in str(refused.value)
