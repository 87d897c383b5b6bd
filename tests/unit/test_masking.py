"""Masking policies: what is never stored, what reconcile keeps, and failing closed."""

from __future__ import annotations

import copy
import pickle
from decimal import Decimal
from typing import Any

import pytest

from celery_agboss.core.masking import MASK, NO_MASKING, RESULT_NOT_STORED_KEY, MaskingPolicy
from celery_agboss.core.protections import MASKING_OVERLAP_BY_POSITION
from celery_agboss.errors import MaskingPolicyError
from celery_agboss.testing import sabotage

REQUEST: dict[str, Any] = {
    "amount": 1000,
    "currency": "usd",
    "order": "order-17",
    "card": {"number": "4242424242424242", "exp": "12/30", "last4": "4242"},
    "customer": {"email": "alice@example.com", "id": "cus_1"},
    "items": [
        {"sku": "a", "card": {"number": "4000000000000002"}},
        {"sku": "b", "card": {"number": "5555555555554444"}},
    ],
}


def test_a_masked_field_is_replaced_by_the_fixed_marker() -> None:
    policy = MaskingPolicy(mask=["card.number", "customer.email"])
    masked = policy.mask_request(REQUEST)
    assert isinstance(masked, dict)
    assert masked["card"] == {"number": MASK, "exp": "12/30", "last4": "4242"}
    assert masked["customer"] == {"email": "***", "id": "cus_1"}
    assert masked["amount"] == 1000 and masked["order"] == "order-17"


def test_masking_never_changes_the_callers_request() -> None:
    before = copy.deepcopy(REQUEST)
    MaskingPolicy(mask=["card", "items.*.card.number"]).mask_request(REQUEST)
    assert before == REQUEST


def test_a_star_matches_every_key_and_every_list_item() -> None:
    masked = MaskingPolicy(mask=["items.*.card.number", "customer.*"]).mask_request(REQUEST)
    assert isinstance(masked, dict)
    assert [item["card"]["number"] for item in masked["items"]] == [MASK, MASK]
    assert [item["sku"] for item in masked["items"]] == ["a", "b"]
    assert masked["customer"] == {"email": MASK, "id": MASK}


def test_a_number_segment_names_one_list_item() -> None:
    masked = MaskingPolicy(mask=["items.1.card"]).mask_request(REQUEST)
    assert isinstance(masked, dict)
    assert masked["items"][0]["card"] == {"number": "4000000000000002"}
    assert masked["items"][1]["card"] == MASK


def test_a_masked_object_is_replaced_whole() -> None:
    masked = MaskingPolicy(mask=["card"]).mask_request(REQUEST)
    assert isinstance(masked, dict)
    assert masked["card"] == MASK


def test_a_missing_field_or_a_null_has_nothing_to_mask() -> None:
    policy = MaskingPolicy(mask=["card.number", "billing.address.line1"])
    assert policy.mask_request({"amount": 1}) == {"amount": 1}
    assert policy.mask_request({"card": None}) == {"card": None}


def test_a_path_that_meets_a_string_masks_that_string() -> None:
    # The card came as one string where the policy expected an object: hide it whole.
    masked = MaskingPolicy(mask=["card.number"]).mask_request({"card": "4242424242424242"})
    assert masked == {"card": MASK}


def test_results_are_masked_by_the_same_paths() -> None:
    result = {"id": "ch_1", "card": {"number": "4242424242424242"}}
    masked = MaskingPolicy(mask=["card.number"]).mask_result(result)
    assert masked == {"id": "ch_1", "card": {"number": MASK}}


def test_tuples_are_stored_as_lists() -> None:
    assert NO_MASKING.mask_request({"a": (1, 2)}) == {"a": [1, 2]}


def test_no_masking_still_refuses_what_cannot_be_stored_naming_the_path() -> None:
    with pytest.raises(MaskingPolicyError, match=r"\$\.amount") as caught:
        NO_MASKING.mask_request({"amount": Decimal("10.00")})
    assert caught.value.what == "request"


def test_a_value_json_cannot_hold_is_fine_once_it_is_masked() -> None:
    policy = MaskingPolicy(mask=["amount"])
    assert policy.mask_request({"amount": Decimal("10.00")}) == {"amount": MASK}


def test_a_path_both_masked_and_kept_is_refused_at_construction() -> None:
    with pytest.raises(MaskingPolicyError, match="order") as caught:
        MaskingPolicy(mask=["order"], keep_for_reconcile=["order"])
    assert caught.value.policy == "mask"


@pytest.mark.parametrize(
    ("mask", "keep"),
    [
        (["card"], ["card.last4"]),  # masking the parent hides the kept child
        (["*"], ["order"]),
        (["items.*.card"], ["items.0.card.last4"]),
        (["customer.email"], ["customer"]),  # the kept object would come back changed
        # A list is transparent to a field name: both reach items[0].amount.
        (["items.amount"], ["items.0.amount"]),
        (["items.0"], ["items.amount"]),  # the whole element, its kept amount with it
        (["items.0.amount"], ["items.*.amount"]),
    ],
)
def test_a_mask_that_reaches_a_kept_path_is_refused(mask: list[str], keep: list[str]) -> None:
    with pytest.raises(MaskingPolicyError, match="kept for reconcile"):
        MaskingPolicy(mask=mask, keep_for_reconcile=keep)


def test_other_elements_of_one_list_are_no_overlap() -> None:
    policy = MaskingPolicy(
        mask=["items.0.card"], keep_for_reconcile=["items.1.card", "items.amount"]
    )
    masked = policy.mask_request(
        {"items": [{"card": "4242", "amount": 5}, {"card": "x", "amount": 7}]}
    )
    assert masked == {"items": [{"card": MASK, "amount": 5}, {"card": "x", "amount": 7}]}


def test_twin_overlap_judged_by_position_masks_a_kept_amount() -> None:
    """Reconcile reads the stored request: the amount it compares is ``***``, and every
    lost answer of this call waits for an operator."""
    with sabotage(MASKING_OVERLAP_BY_POSITION):
        policy = MaskingPolicy(mask=["items.amount"], keep_for_reconcile=["items.0.amount"])
    masked = policy.mask_request({"items": [{"amount": 1000}]})
    assert masked == {"items": [{"amount": MASK}]}


def test_disjoint_masked_and_kept_paths_are_accepted() -> None:
    policy = MaskingPolicy(
        mask=["card.number", "items.*.card"], keep_for_reconcile=["order", "card.last4"]
    )
    assert policy.mask == ("card.number", "items.*.card")
    assert policy.keep_for_reconcile == ("order", "card.last4")
    masked = policy.mask_request(REQUEST)
    assert isinstance(masked, dict)
    assert masked["order"] == "order-17" and masked["card"]["last4"] == "4242"


@pytest.mark.parametrize("path", ["", "card..number", ".card", "card.", 7])
def test_a_malformed_path_is_refused_at_construction(path: object) -> None:
    with pytest.raises(MaskingPolicyError, match="path"):
        MaskingPolicy(mask=[path])  # type: ignore[list-item]


def test_a_single_string_instead_of_a_list_of_paths_is_refused() -> None:
    with pytest.raises(MaskingPolicyError, match="list of paths"):
        MaskingPolicy(mask="card.number")


@pytest.mark.parametrize(
    "path", ["$.card.number", "items[0].card", "items.[0]", "card.number ", " card"]
)
def test_a_path_in_another_path_language_or_with_a_space_is_refused(path: str) -> None:
    """Accepted, these would match no field: the card number stored, no error."""
    with pytest.raises(MaskingPolicyError, match="would match nothing") as refused:
        MaskingPolicy(mask=[path])
    assert refused.value.field == path  # type: ignore[attr-defined]


@pytest.mark.parametrize("which", ["mask", "keep_for_reconcile"])
def test_none_instead_of_a_list_of_paths_is_a_masking_policy_error(which: str) -> None:
    with pytest.raises(MaskingPolicyError, match="list of paths"):
        MaskingPolicy(**{which: None})


def test_an_errors_argument_is_masked_by_the_field_paths_as_a_request_is() -> None:
    policy = MaskingPolicy(mask=["card.number", "items.card"])
    masked = policy.mask_error_value(REQUEST)
    assert isinstance(masked, dict) and masked["card"]["number"] == MASK
    assert all(item["card"] == MASK for item in masked["items"])
    assert "4242424242424242" not in repr(masked)


def test_error_texts_pass_through_a_custom_mask() -> None:
    policy = MaskingPolicy(mask_errors=lambda text: text.replace("4242424242424242", "****"))
    assert policy.mask_error_text("declined: 4242424242424242") == "declined: ****"
    assert NO_MASKING.mask_error_text("declined") == "declined"
    assert policy.masks_errors and not NO_MASKING.masks_errors


def test_a_custom_error_mask_that_raises_fails_closed_without_quoting_the_text() -> None:
    def broken(text: str) -> str:
        raise KeyError(text)

    policy = MaskingPolicy(mask_errors=broken)
    with pytest.raises(MaskingPolicyError) as caught:
        policy.mask_error_text("card 4242424242424242 declined")
    assert caught.value.policy == "mask_errors"
    assert "KeyError" in str(caught.value)
    assert "4242" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_custom_error_mask_that_returns_no_string_fails_closed() -> None:
    policy = MaskingPolicy(mask_errors=lambda text: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(MaskingPolicyError, match="NoneType"):
        policy.mask_error_text("declined")


def test_a_mask_errors_that_is_not_callable_is_refused() -> None:
    with pytest.raises(MaskingPolicyError, match="callable"):
        MaskingPolicy(mask_errors="***")  # type: ignore[arg-type]


def test_try_mask_result_answers_the_masked_result_when_masking_works() -> None:
    ok, stored = MaskingPolicy(mask=["card.number"]).try_mask_result({"card": {"number": "4242"}})
    assert ok and stored == {"card": {"number": MASK}}


def test_try_mask_result_answers_a_not_stored_marker_when_masking_fails() -> None:
    # At settle the money has moved: the engine stores this marker instead of failing.
    ok, stored = NO_MASKING.try_mask_result({"id": "ch_1", "card": {"number": object()}})
    assert not ok
    assert isinstance(stored, dict)
    assert list(stored) == [RESULT_NOT_STORED_KEY]
    assert "$.card.number" in stored[RESULT_NOT_STORED_KEY]


def test_an_unexpected_error_while_masking_fails_closed() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(MaskingPolicyError) as caught:
        NO_MASKING.mask_result(cyclic)
    assert caught.value.what == "result"


def test_a_masking_error_pickles_with_its_fields() -> None:
    with pytest.raises(MaskingPolicyError) as caught:
        MaskingPolicy(mask=["a"], keep_for_reconcile=["a"])
    copy_ = pickle.loads(pickle.dumps(caught.value))
    assert (copy_.policy, copy_.field, str(copy_)) == ("mask", "a", str(caught.value))


# --- lists are masked element-wise (design: masking) ------------------------------------------


def test_a_path_through_a_list_masks_that_field_of_every_element() -> None:
    masked = MaskingPolicy(mask=["items.card.number"]).mask_request(REQUEST)
    assert isinstance(masked, dict)
    assert [item["card"]["number"] for item in masked["items"]] == [MASK, MASK]
    assert [item["sku"] for item in masked["items"]] == ["a", "b"]


def test_a_list_of_values_under_a_masked_path_is_masked_value_by_value() -> None:
    masked = MaskingPolicy(mask=["cards"]).mask_request({"cards": ["4242", "5555"]})
    assert masked == {"cards": MASK}
    masked = MaskingPolicy(mask=["cards.number"]).mask_request({"cards": ["4242", "5555"]})
    assert masked == {"cards": [MASK, MASK]}


def test_without_element_wise_masking_a_list_keeps_the_card_numbers() -> None:
    from celery_agboss.core.protections import LISTS_NOT_MASKED_ELEMENT_WISE
    from celery_agboss.testing.switches import sabotage

    with sabotage(LISTS_NOT_MASKED_ELEMENT_WISE):
        masked = MaskingPolicy(mask=["items.card.number"]).mask_request(REQUEST)
    assert "4000000000000002" in repr(masked), "stored in clear"


def test_a_mask_that_is_not_a_policy_is_refused_at_declaration_naming_what_to_pass() -> None:
    from celery_agboss import NotSent, OutboundCall
    from celery_agboss.errors import OutboundCallDefinitionError

    with pytest.raises(OutboundCallDefinitionError, match=r"mask=MaskingPolicy\(mask=") as caught:
        OutboundCall(
            name="shop.charge",
            send=lambda c: None,
            reconcile=lambda c, lk: NotSent(),
            key_retention=86400,
            mask=["card.number"],
        )  # type: ignore[arg-type]
    assert getattr(caught.value, "rule", None) == "mask"
