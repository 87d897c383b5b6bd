"""``celery_agboss.flower``: what Flower makes of celery_agboss's events, without Flower.

Celery's own event-state machine (the one Flower runs) is fed the events a worker sends;
``format_task`` then gets a ``copy.copy`` of the task, as Flower gives it.
"""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

import pytest
from celery.events.state import State

from celery_agboss.flower import (
    AGBOSS_STATES,
    format_task,
    keep_custom_fields_on_copies,
    repr_options,
    scrub,
)

CARD = "4242 4242 4242 4242"


def _feed(*events: tuple[str, dict[str, Any]]) -> Any:
    state = State()
    task_id = str(uuid.uuid4())
    for clock, (type_, fields) in enumerate(events, start=1):
        state.event(
            {
                "type": type_,
                "uuid": task_id,
                "hostname": "w@h",
                "clock": clock,
                "timestamp": time.time(),
                "local_received": time.time(),
                **fields,
            }
        )
    return state.tasks[task_id]


def test_every_agboss_event_becomes_its_own_state_in_flower() -> None:
    for event, label in AGBOSS_STATES.items():
        task = _feed(
            ("task-received", {"name": "shop.charge"}),
            ("task-started", {}),
            (event, {"agboss_event": event[5:]}),
        )
        assert task.state == label


def test_a_reconciled_success_is_labelled_and_its_fields_surface() -> None:
    task = _feed(
        ("task-received", {"name": "shop.charge", "args": "('o-1',)"}),
        ("task-started", {}),
        ("task-reconciling", {"agboss_event": "reconciling", "outcome": "RECONCILED"}),
        ("task-succeeded", {"result": "{'payment': 'ch_1'}", "runtime": 0.1}),
    )
    assert task.state == "SUCCESS"
    shown = format_task(copy.copy(task))
    assert shown.state == "SUCCESS · RECONCILED"
    assert shown.agboss["outcome"] == "RECONCILED"
    assert shown.as_dict()["agboss"]["agboss_event"] == "reconciling"
    assert task.state == "SUCCESS"  # Flower's own task is left alone


@pytest.mark.parametrize(
    ("replayed_as", "shown_as"),
    [("RECONCILED", "SUCCESS · RECONCILED"), ("REPLAYED", "SUCCESS · REPLAYED")],
    ids=["of-a-recovered-execution", "of-a-finished-one"],
)
def test_a_duplicate_after_the_completion_keeps_the_executions_label(
    replayed_as: str, shown_as: str
) -> None:
    """Flower keeps one row per task id and the last event's fields: a duplicate replayed
    after a crash recovery completed says RECONCILED (``replaying`` sends it so), and the
    row stays what docs/operators.md promises; any other duplicate says REPLAYED."""
    task = _feed(
        ("task-received", {"name": "shop.charge"}),
        ("task-reconciling", {"agboss_event": "reconciling", "reason": "taken-over"}),
        ("task-reconciling", {"agboss_event": "reconciling", "outcome": "RECONCILED"}),
        ("task-succeeded", {"result": "{'payment': 'ch_1'}"}),
        ("task-received", {"name": "shop.charge"}),
        ("task-replayed", {"agboss_event": "replayed", "outcome": replayed_as}),
        ("task-succeeded", {"result": "{'payment': 'ch_1'}"}),
    )
    shown = format_task(copy.copy(task))
    assert shown.state == shown_as
    assert shown.agboss["agboss_event"] == "replayed"


def test_a_deferred_task_keeps_its_state_label() -> None:
    task = _feed(
        ("task-received", {"name": "shop.charge"}),
        ("task-deferred", {"agboss_event": "deferred", "reason": "live lease"}),
    )
    shown = format_task(copy.copy(task))
    assert shown.state == "DEFERRED"
    assert shown.agboss["reason"] == "live lease"


def test_a_plain_task_is_only_scrubbed() -> None:
    task = _feed(
        ("task-received", {"name": "shop.ship", "args": f"('{CARD}',)"}),
        ("task-succeeded", {"result": "'ok'"}),
    )
    shown = format_task(copy.copy(task))
    assert shown.state == "SUCCESS"
    assert "agboss" not in shown.as_dict()
    assert "4242 4242" not in shown.args and "****4242" in shown.args


def test_a_failed_tasks_exception_and_traceback_show_no_card_number() -> None:
    """Celery's ``task-failed`` event carries the raised decline as it was, never masked."""
    task = _feed(
        ("task-received", {"name": "shop.pay", "args": "('o-1',)"}),
        (
            "task-failed",
            {
                "exception": f"CardDeclined('card {CARD} declined')",
                "traceback": f"Traceback ...\nCardDeclined: card {CARD} declined\n",
            },
        ),
    )
    shown = format_task(copy.copy(task))
    assert shown.state == "FAILURE"
    for text in (shown.exception, shown.traceback):
        assert "4242 4242" not in text and "****4242" in text


def test_copies_keep_custom_fields_once_the_module_is_imported() -> None:
    keep_custom_fields_on_copies()  # idempotent
    task = _feed(("task-deferred", {"agboss_event": "deferred"}))
    assert copy.copy(task).agboss_event == "deferred"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"card {CARD} ok", "card ****4242 ok"),
        ("4000-0566-5566-5556", "****5556"),
        ("order 12345678901234 is not a card", "order 12345678901234 is not a card"),
        ("amount 1000", "amount 1000"),
    ],
)
def test_scrub_hides_card_numbers_only(text: str, expected: str) -> None:
    assert scrub(text) == expected


def test_repr_options_hide_card_data_from_monitors() -> None:
    options = repr_options(
        ("o-1",), {"card": {"number": CARD, "cvc": "123"}, "amount": 1000, "note": CARD}
    )
    assert options["argsrepr"] == "['o-1']"
    kwargs = options["kwargsrepr"]
    assert "123" not in kwargs and "4242 4242" not in kwargs
    assert "'card': '***'" in kwargs and "****4242" in kwargs and "1000" in kwargs
