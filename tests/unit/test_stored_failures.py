"""What the store keeps of a failure: a definite failure's (the intent's ``failure`` and
its history ``detail``) and the execution's ``error`` (design: masking).

An SDK error that carries the request it refused must not store what the stored request
hides: its dict arguments (and the dicts in its list arguments) pass the call's field
paths as the request does, and its text is that of the exception made again from the
masked arguments, or not kept when it cannot be made again. Texts in a list argument (a
decline's codes, the differences of another request's answer) are not the request's and
are kept: a re-run is handed the failure as it was, and takes the same branch. A failure
whose arguments and text were both not kept is not replayed as if it were. Error texts
are masked before they are cut, so no part of a card number escapes at the cut.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

from celery_agboss import NotSent, OutboundCall
from celery_agboss.adapters import stripe as stripe_adapter
from celery_agboss.adapters.common import AnotherRequestsAnswerError, adapter_policies
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


def test_a_text_of_its_own_is_made_again_from_the_masked_arguments() -> None:
    stored = encode_failure(QuotingDeclined("no", REQUEST), _hide_cards, field_mask(POLICY))
    assert isinstance(stored, dict) and stored["message"].startswith("declined {")
    assert CVC not in json.dumps(stored) and MASK in stored["message"]


class OwnReason(CardDeclined):
    """The common SDK shape: keeps the request, its text is its own reason."""

    def __str__(self) -> str:
        return f"card declined: {self.args[0]}"


def test_an_ordinary_declines_reason_is_kept_for_the_operator() -> None:
    stored = encode_failure(
        OwnReason("insufficient_funds", REQUEST), _hide_cards, field_mask(POLICY)
    )
    assert isinstance(stored, dict) and stored["message"] == "card declined: insufficient_funds"


class RefusesMasks(CardDeclined):
    """A class that will not take its request back masked."""

    def __init__(self, message: str, request: dict[str, Any]) -> None:
        if request["card"]["cvc"] == MASK:
            raise ValueError("a CVC of three or four digits")
        super().__init__(message, request)

    def __str__(self) -> str:
        return f"declined {self.request['card']}"


def test_a_text_that_cannot_be_made_again_is_not_stored_nor_replayed() -> None:
    stored = encode_failure(RefusesMasks("no", REQUEST), _hide_cards, field_mask(POLICY))
    assert isinstance(stored, dict) and stored["message"] == MESSAGE_NOT_STORED
    assert CVC not in json.dumps(stored)
    # Its arguments kept, the replay takes them; with neither kept, nothing is replayed.
    assert rebuild_failure({**stored, "args": None}) is None


class SoftDecline(Exception):
    """A decline carrying the gateway's decline codes (a list of texts)."""

    def __init__(self, message: str, codes: list[str]) -> None:
        super().__init__(message, codes)
        self.codes = codes


def test_a_list_of_decline_codes_is_replayed_as_it_was() -> None:
    stored = encode_failure(
        SoftDecline("declined", ["insufficient_funds"]), _hide_cards, field_mask(POLICY)
    )
    replayed = rebuild_failure(stored)
    assert isinstance(replayed, SoftDecline) and replayed.codes == ["insufficient_funds"]


def test_the_differences_of_another_requests_answer_are_replayed_as_they_were() -> None:
    """Definite for every adapter, ``.differences`` public: the Stripe adapter's own policy
    (it masks ``source``) must not turn them into masks."""
    payments, _ = adapter_policies(stripe_adapter.CARD_DATA, ())
    exc = AnotherRequestsAnswerError("Stripe answered another payment", ["amount 1000 != 2000"])
    replayed = rebuild_failure(encode_failure(exc, payments.mask_error_text, field_mask(payments)))
    assert isinstance(replayed, AnotherRequestsAnswerError)
    assert replayed.differences == ["amount 1000 != 2000"]


def test_a_dict_in_a_list_argument_is_masked_as_a_request() -> None:
    stored = encode_failure(SoftDecline("declined", [REQUEST]), _hide_cards, field_mask(POLICY))
    assert CVC not in json.dumps(stored) and PAN not in json.dumps(stored)


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


class AmountDeclined(Exception):
    """An SDK's decline with the answer's details, a ``Decimal`` amount among them."""


def test_a_decline_holding_a_value_json_cannot_hold_keeps_its_text_and_replays() -> None:
    """Nothing in it is masked: its text is kept and a re-run is handed it again (from
    its text: its arguments are not JSON), never the not-stored marker."""
    exc = AmountDeclined("card declined: insufficient_funds", {"amount": Decimal("10.00")})
    stored = encode_failure(exc, _hide_cards, field_mask(POLICY))
    assert isinstance(stored, dict) and stored["message"] == str(exc)
    replayed = rebuild_failure(stored)
    assert isinstance(replayed, AmountDeclined) and "insufficient_funds" in str(replayed)
