"""An undo's declaration says its step moves no money only when its record says so in
as many words: a record written before ``OutboundCall.moves_money`` existed, or by a
worker of the previous release, is a payment's (``--payments-handled`` stands for it,
and its undo is never run twice)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss.core.compensation import declaration_of
from celery_agboss.core.store_protocol import INTENT_RECORD

STORED = {"step": "t:b:order%3A1%3Asku:shop.hold-stock", "undo": "release-stock", "n": 1}


@pytest.mark.parametrize(
    ("said", "moves_money"),
    [({}, True), ({"moves_money": False}, False), ({"moves_money": "false"}, True)],
)
def test_only_a_stored_false_reads_as_moving_no_money(
    said: dict[str, Any], moves_money: bool
) -> None:
    declaration = declaration_of(1, {**STORED, "kind": INTENT_RECORD, **said})
    assert declaration.moves_money is moves_money
