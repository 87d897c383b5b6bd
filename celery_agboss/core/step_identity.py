"""Which step of a delivery's body this is, and the key its record is kept under.

Decided once, by the ``ExecutionContext`` that runs the step (it counts the steps of
each name): the outbound call's intent, the fenced effect's record, the outbox rows the
effect writes and the undo declared after the step all read the ``Step`` it made. Were
the position counted, or the key derived, in two places, an undo could be declared
under one key while the intent or the outbox row is kept under another.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery_agboss.core.keys import (
    KEY_COLUMN_LENGTH,
    business_key,
    fit_key,
    step_key,
    validate_business_key,
)
from celery_agboss.core.log_events import OUTBOUND_CALL_POSITION_KEYS, log_event

RESERVED_EFFECT_PREFIX = "agboss."
"""The names the package keeps its own fenced records under (undo declarations, body
publishes, undo tasks): a user's effect of such a name would share their keys, and the
store would read it as one of ours (an undo declaration run at failure)."""


_warned_position_keys: set[str] = set()


def warn_position_keys(call_name: str) -> None:
    """Once per call name and process: a call made twice in one delivery without a business
    key is keyed by position (``name#1``, ``name#2``), which is only as stable as the
    body's loop; a loop whose length can change between deliveries (over "the
    installments not paid yet") would charge one installment twice and another never."""
    if call_name in _warned_position_keys:
        return
    _warned_position_keys.add(call_name)
    log_event(
        OUTBOUND_CALL_POSITION_KEYS,
        logging.WARNING,
        "called more than once in one delivery without a business key; its calls are keyed "
        "by position (#1, #2, …). If the body's loop can change between deliveries, give "
        "each call a business_key of its own (e.g. f'installment:{installment.id}')",
        call=call_name,
    )


def refuse_reserved_effect_name(name: str) -> None:
    """An application's fenced effect may not take a name the package keeps its own under."""
    if isinstance(name, str) and name.startswith(RESERVED_EFFECT_PREFIX):
        raise ValueError(
            f"the fenced effect name {name!r} starts with {RESERVED_EFFECT_PREFIX!r}, which "
            "celery_agboss keeps for its own records; name the effect without that prefix"
        )


DERIVED_ID_HEADER = "agboss_derived_id"
"""A message header: this publish's task id is one celery_agboss derived for a body's
publish (its execution and position), so a re-run of that body sends it again, maybe
with other arguments (design: one task per id); a caller's own id never carries it."""


@dataclass(frozen=True)
class Step:
    """One outbound call or fenced effect of a delivery's body, as its records name it."""

    kind: str  # the record it is kept as: core.store_protocol.INTENT_RECORD or EFFECT_RECORD
    name: str  # the call's or the effect's name
    occurrence: int  # its position among this delivery's steps of this name (1 when keyed)
    key: str  # the key its record (intent, effect) is kept under
    business_key_text: str | None  # the body's business key, or None (keyed by position)


def step_of(
    kind: str,
    tenant: str,
    execution_id: str,
    name: str,
    business_key_text: str | None,
    occurrence: int,
    *,
    max_key_length: int | None = None,
) -> Step:
    """The step and its key: ``<tenant>:b:<business key>:<name>`` under a business key,
    else ``<tenant>:t:<execution id>:<name>[#n]`` by position (``core.keys``), made to
    fit the store's key column and ``max_key_length`` when the gateway bounds it (an
    outbound call's) — the shorter of the two. A business key is bounded in code points
    before it is encoded, so its key can outgrow the column with no gateway limit at
    all; ``fit_key`` leaves a key that fits unchanged, so records made under one are
    still found by it."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a step needs a non-empty name, not {name!r}")
    if business_key_text is not None:
        raw = business_key(tenant, validate_business_key(business_key_text), name)
        occurrence = 1
    else:
        raw = step_key(tenant, execution_id, name, occurrence)
    limit = KEY_COLUMN_LENGTH if max_key_length is None else min(max_key_length, KEY_COLUMN_LENGTH)
    key = fit_key(raw, limit)
    return Step(kind, name, occurrence, key, business_key_text)


__all__ = [
    "DERIVED_ID_HEADER",
    "Step",
    "refuse_reserved_effect_name",
    "step_of",
    "warn_position_keys",
]
