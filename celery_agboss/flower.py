"""Flower 2.x: what celery_agboss's task events look like there, and how to show more.

Flower builds each task from events only (design: trap 11). celery_agboss sends
custom task events when a delivery ends without a result Celery knows about (a
deferral, a reconcile, a fence, a pause, a wait, a park); Flower files each under the
task's id and shows its type as the state (``task-deferred`` → ``DEFERRED``). Their
fields (the outcome, the reason…) are kept on Flower's task but not displayed:
``format_task`` surfaces them. In ``flowerconfig.py``::

    from celery_agboss.flower import format_task  # noqa: F401  (Flower reads the name)

Arguments show as the message's ``argsrepr``/``kwargsrepr``: publish card data with
:func:`repr_options` so Flower (and every event consumer) never sees it, and
``format_task`` also blanks anything that looks like a card number there, and in a
failed task's exception and traceback.

One patch, made when this module is imported: Flower hands ``format_task`` a
``copy.copy`` of its task, and Celery's ``Task.__reduce__`` keeps only the standard
fields, so every custom event field would be gone from the copy. Importing this module
gives ``celery.events.state.Task`` a ``__copy__`` that keeps them (a shallow copy of its
attributes; nothing else in Celery copies tasks).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from celery_agboss.runtime.task_events import TASK_EVENTS

AGBOSS_STATES: dict[str, str] = {
    event: event[len("task-") :].upper() for event in sorted(TASK_EVENTS)
}
"""Each celery_agboss task event and the state Flower shows for it."""

SURFACED_FIELDS = (
    "agboss_event",
    "outcome",
    "reason",
    "agboss_state",
    "recovery_count",
    "token",
    "pause_id",
    "delay",
    "by",
)
"""Fields of celery_agboss events that ``format_task`` brings out (ids and counts only:
events never carry a business key, an amount or a card field)."""

DEFAULT_HIDDEN_KEYS = frozenset(
    {
        "card",
        "card_number",
        "cardnumber",
        "number",
        "pan",
        "cvc",
        "cvv",
        "cvv2",
        "cvn",
        "exp_month",
        "exp_year",
        "expiry",
        "track",
        "track1",
        "track2",
        "pin",
        "iban",
        "account_number",
        "token",
        "source",
        "payment_method",
        "password",
        "secret",
    }
)
"""Keys whose values ``repr_options`` replaces by ``'***'`` (compared lower-cased)."""

_SCRUBBED_FIELDS = ("args", "kwargs", "result", "exception", "traceback")
"""The texts of Flower's task in which ``format_task`` blanks card numbers."""

_CARD_NUMBER = re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)")
_MASK = "***"


def _copy_task(task: Any) -> Any:
    clone = object.__new__(type(task))
    clone.__dict__.update(task.__dict__)
    return clone


def keep_custom_fields_on_copies() -> None:
    """Give Celery's event-state ``Task`` a ``__copy__`` that keeps every field (see the
    module docstring); idempotent. Done on import."""
    from celery.events.state import Task  # deferred: only Flower's process needs it

    if "__copy__" not in vars(Task):
        Task.__copy__ = _copy_task


keep_custom_fields_on_copies()


def scrub(text: str) -> str:
    """``text`` with every run of 13–19 digits (spaces or dashes allowed) that passes the
    Luhn check replaced by ``****`` and its last four digits."""

    def replace(match: re.Match[str]) -> str:
        digits = re.sub(r"\D", "", match.group(0))
        return f"****{digits[-4:]}" if _luhn(digits) else match.group(0)

    return _CARD_NUMBER.sub(replace, text)


def _luhn(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _hidden(value: Any, hide: frozenset[str]) -> Any:
    if isinstance(value, Mapping):
        return {
            key: _MASK if str(key).lower() in hide else _hidden(item, hide)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(_hidden(item, hide) for item in value)
    if isinstance(value, str):
        return scrub(value)
    return value


def repr_options(
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    hide: Iterable[str] = DEFAULT_HIDDEN_KEYS,
) -> dict[str, str]:
    """``argsrepr`` and ``kwargsrepr`` for ``apply_async``: the arguments with card data
    hidden (values under ``hide`` keys, card numbers anywhere). The message itself still
    carries the real arguments; only what monitors display changes::

        charge.apply_async(args, kwargs, **repr_options(args, kwargs))
    """
    hidden = frozenset(name.lower() for name in hide)
    return {
        "argsrepr": repr(_hidden(list(args), hidden)),
        "kwargsrepr": repr(_hidden(dict(kwargs or {}), hidden)),
    }


def agboss_fields(task: Any) -> dict[str, Any]:
    """The celery_agboss fields Flower kept on ``task`` (from the last event carrying each)."""
    data = getattr(task, "__dict__", {})
    return {name: data[name] for name in SURFACED_FIELDS if data.get(name) is not None}


def outcome_label(fields: Mapping[str, Any]) -> str | None:
    """One word for what celery_agboss did with the task: ``RECONCILED``, ``REPLAYED``,
    ``DEFERRED``, ``UNRECONCILED``, ``FENCED``, ``PAUSED``, ``PARKED``, ``WAITING``…"""
    event = fields.get("agboss_event")
    if event in ("reconciling", "replayed") and fields.get("outcome"):
        return str(fields["outcome"])
    if event:
        return "RECONCILING" if event == "reconciling" else str(event).upper()
    if fields.get("outcome"):
        return str(fields["outcome"])
    state = fields.get("agboss_state")
    return None if state is None else str(state)


def format_task(task: Any) -> Any:
    """Flower's ``format_task`` hook (Flower hands it a copy of its task).

    Adds an ``agboss`` field (shown on the task page and in the tasks table's JSON),
    labels the state with celery_agboss's outcome (``SUCCESS · RECONCILED``), and blanks
    card numbers in the arguments, the result, and a failure's exception and traceback
    (Celery's ``task-failed`` event carries the raised decline as it was, never masked).
    """
    for name in _SCRUBBED_FIELDS:
        value = getattr(task, name, None)
        if isinstance(value, str):
            setattr(task, name, scrub(value))
    fields = agboss_fields(task)
    if not fields:
        return task
    label = outcome_label(fields)
    task.agboss = {**fields, **({"outcome": label} if label else {})}
    fields_of = tuple(getattr(task, "_fields", ()))
    if "agboss" not in fields_of:
        task._fields = (*fields_of, "agboss")
    state = getattr(task, "state", None)
    if label and state and label != state:
        task.state = f"{state} · {label}"
    return task


__all__ = [
    "format_task",
    "repr_options",
]
