"""How a canvas published from a body is planned: JSON, every id fixed, nested ones refused.

Publishes from a body (design: publishes from a body): the recorded canvas must go out under the
same ids however often it is sent (its re-send by the sweep included), and a canvas whose ids
Celery would choose as it runs is refused, naming what to do. Sent here on Celery's
in-memory transport, outside any body (so Celery's own apply runs), and read at
``before_task_publish``: what would reach the broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery import signals as celery_signals

from celery_agboss import ConfigurationError
from celery_agboss.outbox.publishing import CANVAS_TASK_NAME, _send_canvas
from celery_agboss.runtime.messages import dumps
from celery_agboss.signals.body_publishes import CanvasPlan, install, plan_canvas
from celery_agboss.store.outbox_rows import OutboxMessage


def _nothing(*args: Any) -> None:
    """The body of every task here: only what is published is looked at."""


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("canvas-plans", broker="memory://", backend="cache+memory://")
    app.conf.task_default_queue = "canvas-plans"
    for name in ("a", "b", "c"):
        app.task(name=f"cp.{name}", shared=False)(_nothing)
    install()
    yield app
    app.close()


@pytest.fixture
def sent() -> Iterator[list[dict[str, Any]]]:
    messages: list[dict[str, Any]] = []

    def on_publish(headers: Any = None, body: Any = None, **_: Any) -> None:
        embed = body[2] or {}
        messages.append(
            {
                "task": headers["task"],
                "id": headers["id"],
                "group": headers.get("group"),
                "chain": [s["options"]["task_id"] for s in embed.get("chain") or []],
                "chord": (embed.get("chord") or {}).get("options", {}).get("task_id"),
            }
        )

    celery_signals.before_task_publish.connect(on_publish, weak=False)
    try:
        yield messages
    finally:
        celery_signals.before_task_publish.disconnect(on_publish)


def _sig(app: Celery, name: str, *args: Any) -> Any:
    return app.signature(f"cp.{name}", args=args)


def _plan(canvas: Any, *args: Any, **options: Any) -> tuple[CanvasPlan, dict[str, Any]]:
    kwargs = options.pop("call_kwargs", None)
    plan = plan_canvas(canvas, args, kwargs, options)
    assert plan is not None
    return plan, plan.fix_ids(lambda part: f"X/{part}")


def _send_twice(app: Celery, plan: CanvasPlan, sent: list[dict[str, Any]]) -> list[Any]:
    """The recorded canvas sent twice, as the outbox sends it: the same messages."""
    message = OutboxMessage("row", CANVAS_TASK_NAME, dumps([plan.data]), dumps(plan.call), "{}")
    rounds, results = [], []
    for _ in range(2):
        sent.clear()
        results.append(_send_canvas(app, message))
        rounds.append(list(sent))
    assert rounds[0] == rounds[1]
    assert [r.id for r in results] == [results[0].id] * 2
    return [rounds[0], results[0]]


def test_a_chain_goes_out_under_an_id_per_task(app: Celery, sent: list[Any]) -> None:
    plan, fixed = _plan(chain(_sig(app, "a", 1), _sig(app, "b"), _sig(app, "c")))
    assert plan.name == "chain:cp.a"
    assert fixed["tasks"] == ["X/0", "X/1", "X/2"]
    messages, result = _send_twice(app, plan, sent)
    assert messages == [
        {"task": "cp.a", "id": "X/0", "group": None, "chain": ["X/2", "X/1"], "chord": None}
    ]
    assert result.id == "X/2"


def test_a_group_goes_out_under_its_own_id_and_one_per_task(app: Celery, sent: list[Any]) -> None:
    plan, fixed = _plan(group(_sig(app, "a", n) for n in range(3)))
    assert (fixed["group"], fixed["tasks"]) == ("X/group", ["X/0", "X/1", "X/2"])
    messages, result = _send_twice(app, plan, sent)
    assert [(m["id"], m["group"]) for m in messages] == [(f"X/{n}", "X/group") for n in range(3)]
    assert result.id == "X/group"


@pytest.mark.parametrize("header", ["list", "group", "called"])
def test_a_chord_goes_out_under_ids_for_its_header_and_body(
    app: Celery, sent: list[Any], header: str
) -> None:
    tasks = [_sig(app, "a", 1), _sig(app, "b", 2)]
    if header == "called":  # chord(header)(body)
        plan, fixed = _plan(chord(tasks), call_kwargs={"body": _sig(app, "c")})
    else:
        plan, fixed = _plan(chord(group(tasks) if header == "group" else tasks, _sig(app, "c")))
    assert fixed == {
        "kind": "chord",
        "group": "X/header",
        "tasks": ["X/header/0", "X/header/1"],
        "body": "X/body",
    }
    messages, result = _send_twice(app, plan, sent)
    assert [(m["id"], m["group"], m["chord"]) for m in messages] == [
        ("X/header/0", "X/header", "X/body"),
        ("X/header/1", "X/header", "X/body"),
    ]
    assert result.id == "X/body"


def test_an_id_the_caller_gave_is_kept(app: Celery) -> None:
    _, fixed = _plan(chain(_sig(app, "a").set(task_id="mine"), _sig(app, "b")), task_id="last")
    assert fixed["tasks"] == ["mine", "last"]
    _, fixed = _plan(group(_sig(app, "a")), task_id="the-group")
    assert fixed["group"] == "the-group"


def test_what_only_says_how_to_send_is_not_recorded(app: Celery) -> None:
    plan, _ = _plan(chain(_sig(app, "a")), producer=object(), countdown=5, priority=3)
    assert plan.call["options"] == {"countdown": 5, "priority": 3}


@pytest.mark.parametrize(
    "nested",
    [
        lambda app: chain(_sig(app, "a"), group(_sig(app, "b"), _sig(app, "c")), _sig(app, "a")),
        lambda app: chain(_sig(app, "a"), group(_sig(app, "b"), _sig(app, "c"))),
        lambda app: group(chain(_sig(app, "a"), _sig(app, "b")), _sig(app, "c")),
        lambda app: chord([_sig(app, "a")], chain(_sig(app, "b"), _sig(app, "c"))),
    ],
    ids=["group-in-chain", "group-ending-a-chain", "chain-in-group", "chain-as-chord-body"],
)
def test_a_canvas_inside_a_canvas_is_refused_naming_what_to_do(app: Celery, nested: Any) -> None:
    with pytest.raises(ConfigurationError) as refused:
        plan_canvas(nested(app), None, None, {})
    text = str(refused.value)
    assert "canvas inside a canvas" in text
    assert "Publish its first task" in text and "link=" in text
    assert "celery_agboss.outbox.enqueue" in text


def test_an_empty_canvas_is_left_to_celery(app: Celery) -> None:
    assert plan_canvas(group([]), None, None, {}) is None


def test_arguments_json_cannot_carry_are_refused(app: Celery) -> None:
    with pytest.raises(ConfigurationError, match="JSON"):
        plan_canvas(chain(_sig(app, "a", object())), None, None, {})
