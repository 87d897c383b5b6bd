"""What the store keeps of a failure: a definite failure's (the intent's ``failure`` and
its history ``detail``) and the execution's ``error`` (design: masking).

An SDK error that carries the request it refused must not store what the stored request
hides: its dict arguments pass the call's field paths as the request does, and its text
is made again from the masked arguments, or not kept when it is made otherwise. Error
texts are masked before they are cut, so no part of a card number escapes at the cut.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

from celery_agboss import NotSent, OutboundCall
from celery_agboss.core.failures import (
    MESSAGE_NOT_STORED,
    encode_failure,
    field_mask,
    rebuild_failure,
)
from celery_agboss.core.masking import MASK, MaskingPolicy
from celery_agboss.core.transitions import error_detail
from celery_agboss.delivery.outcomes import MAX_MESSAGE_CHARS, encode_error

PAN = "4111111111111111"
CVC = "cvc-737"  # a CVC as a text nothing else can hold by chance
REQUEST = {"amount": 1000, "order": "o-1", "card": {"number": PAN, "cvc": CVC}}


def _hide_cards(text: str) -> str:
    return re.sub(r"\d{13,19}", "****", text)


POLICY = MaskingPolicy(
    mask=["card.number", "card.cvc"],
    keep_for_reconcile=["amount", "order"],
    mask_errors=_hide_cards,
)


class CardDeclined(Exception):
    """A gateway SDK error that keeps the request it refused (as many SDKs do)."""

    def __init__(self, message: str, request: dict[str, Any]) -> None:
        super().__init__(message, request)
        self.request = request


class QuotingDeclined(CardDeclined):
    """Its text is its own, quoting the request's card."""

    def __str__(self) -> str:
        return f"declined {self.request['card']}"


def _call() -> OutboundCall:
    return OutboundCall(
        name="shop.card_charge",
        send=lambda call: None,
        reconcile=lambda call, lookup: NotSent(),
        key_retention=timedelta(hours=24),
        mask=POLICY,
    )


def test_a_declined_requests_card_fields_are_masked_in_the_stored_failure() -> None:
    stored = encode_failure(CardDeclined("card declined", REQUEST), _hide_cards, field_mask(POLICY))
    assert isinstance(stored, dict)
    assert stored["args"] == [
        "card declined",
        {"amount": 1000, "order": "o-1", "card": {"number": MASK, "cvc": MASK}},
    ]
    assert CVC not in json.dumps(stored) and PAN not in json.dumps(stored)
    assert "card declined" in str(stored["message"])  # made again from the masked arguments
    replayed = rebuild_failure(stored)  # a re-run gets the masked request back
    assert isinstance(replayed, CardDeclined) and replayed.request["card"]["cvc"] == MASK


def test_a_text_not_made_of_the_arguments_is_not_stored_once_a_field_was_masked() -> None:
    stored = encode_failure(QuotingDeclined("no", REQUEST), _hide_cards, field_mask(POLICY))
    assert isinstance(stored, dict) and stored["message"] == MESSAGE_NOT_STORED
    assert CVC not in json.dumps(stored)


def test_a_failure_whose_arguments_hold_no_masked_field_keeps_its_text() -> None:
    exc = CardDeclined("card declined", {"amount": 1000, "order": "o-1"})
    stored = encode_failure(exc, _hide_cards, field_mask(POLICY))
    assert isinstance(stored, dict) and stored["message"] == str(exc)


def test_the_history_detail_of_a_decline_holds_no_masked_field() -> None:
    detail = error_detail(_call(), CardDeclined("card declined", REQUEST))
    assert detail["error"] and "card declined" in detail["error"]
    assert CVC not in detail["error"] and PAN not in detail["error"]


def test_the_executions_error_masks_fields_then_texts() -> None:
    stored = json.loads(
        encode_error(CardDeclined("card declined", REQUEST), _hide_cards, field_mask(POLICY))
    )
    assert stored["args"][1]["card"] == {"number": MASK, "cvc": MASK}
    assert CVC not in stored["message"] and PAN not in stored["message"]


def test_a_long_decline_text_is_masked_before_it_is_cut() -> None:
    """A card number across the cut would escape the mask: its first digits stored."""
    exc = RuntimeError("x" * (MAX_MESSAGE_CHARS - 12) + PAN + " declined")
    stored = json.loads(encode_error(exc, _hide_cards))
    assert len(stored["message"]) <= MAX_MESSAGE_CHARS
    assert PAN[:12] not in stored["message"] and "x****" in stored["message"]
