"""Business-key rules, the key grammar, key fitting and keyed digests (no service needed).

The golden values here pin what is sent to gateways and stored with intents in
flight: a change to any of them is a breaking change (CHANGELOG, migration note).
"""

from __future__ import annotations

import pickle

import pytest

import celery_agboss
from celery_agboss.core import keys
from celery_agboss.core.keys import (
    KeyRule,
    business_key,
    business_key_handle,
    fingerprint,
    fit_key,
    pseudonym_key_bytes,
    step_key,
    validate_business_key,
    validate_tenant,
)
from celery_agboss.errors import ConfigurationError, InvalidBusinessKeyError

TASK_ID = "0d2f6c1e-5a4b-4c3d-9e8f-7a6b5c4d3e2f"
PSEUDONYM_KEY = b"0123456789abcdef0123456789abcdef"

# -- the key grammar (golden) ---------------------------------------------------


@pytest.mark.parametrize(
    ("built", "expected"),
    [
        (
            lambda: step_key("default", TASK_ID, "stripe.charge", 1),
            f"default:t:{TASK_ID}:stripe.charge",
        ),
        (
            lambda: step_key("default", TASK_ID, "stripe.charge", 2),
            f"default:t:{TASK_ID}:stripe.charge#2",
        ),
        (
            lambda: step_key("default", TASK_ID, "stripe.charge", 10),
            f"default:t:{TASK_ID}:stripe.charge#10",
        ),
        (lambda: step_key("default", TASK_ID, "mark-paid", 1), f"default:t:{TASK_ID}:mark-paid"),
        (lambda: step_key("acme:eu", "a:b", "x#2", 1), "acme%3Aeu:t:a%3Ab:x%232"),
        (lambda: step_key("acme:eu", "a:b", "x", 2), "acme%3Aeu:t:a%3Ab:x#2"),
        (
            lambda: business_key("default", "order-1", "stripe.charge"),
            "default:b:order-1:stripe.charge",
        ),
        (
            lambda: business_key("default", "order:1", "stripe.charge"),
            "default:b:order%3A1:stripe.charge",
        ),
        (lambda: business_key("default", "order#1", "refund"), "default:b:order%231:refund"),
        (lambda: business_key("default", "100%", "refund"), "default:b:100%25:refund"),
        (
            lambda: business_key("shop #1", "order 1", "stripe.charge"),
            "shop%20%231:b:order%201:stripe.charge",
        ),
        (
            lambda: business_key("default", "café", "stripe.charge"),
            "default:b:caf%C3%A9:stripe.charge",
        ),
        (
            lambda: business_key("東京", "注文-7", "adyen.payment"),
            "%E6%9D%B1%E4%BA%AC:b:%E6%B3%A8%E6%96%87-7:adyen.payment",
        ),
        (lambda: business_key("default", "🙂", "x.y"), "default:b:%F0%9F%99%82:x.y"),
        # A store's own deployment id (migration 0007: a-z2-7, needs no encoding).
        (
            lambda: business_key("k3v7q2m5xa", "order:42", "stripe.charge"),
            "k3v7q2m5xa:b:order%3A42:stripe.charge",
        ),
        (
            lambda: step_key("k3v7q2m5xa", TASK_ID, "adyen.charge", 2),
            f"k3v7q2m5xa:t:{TASK_ID}:adyen.charge#2",
        ),
        (lambda: business_key("default", "A-z_0.9~", "x.y"), "default:b:A-z_0.9~:x.y"),
        (
            lambda: business_key("default", "a/b+c=d?e&f@g", "x.y"),
            "default:b:a%2Fb%2Bc%3Dd%3Fe%26f%40g:x.y",
        ),
    ],
)
def test_the_key_grammar_is_pinned_by_golden_keys(built: object, expected: str) -> None:
    assert callable(built)
    assert built() == expected


def test_a_name_ending_in_hash_n_never_meets_the_nth_call_of_another_name() -> None:
    assert step_key("t", TASK_ID, "x#2", 1) != step_key("t", TASK_ID, "x", 2)


def test_a_step_keyed_and_a_business_keyed_call_never_share_a_key() -> None:
    assert step_key("t", "b", "n", 1) != business_key("t", "b", "n")
    assert business_key("t", "t", "n").split(":")[1] == "b"


def test_the_business_key_is_validated_before_a_key_is_built() -> None:
    with pytest.raises(InvalidBusinessKeyError) as caught:
        business_key("default", "order-1\u200b", "stripe.charge")
    assert caught.value.rule == "control-or-format"


@pytest.mark.parametrize("tenant", ["", " acme", "ac\u00a0me", "acme\u200d"])
def test_a_bad_tenant_is_a_configuration_error_naming_its_rule(tenant: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        step_key(tenant, TASK_ID, "stripe.charge", 1)
    assert caught.value.fields["rule"] in {rule.value for rule in KeyRule}
    assert caught.value.fields["setting"] == "agboss_tenant"
    assert validate_tenant("acme") == "acme"


@pytest.mark.parametrize("occurrence", [0, -1, True, 1.0])
def test_occurrences_count_from_one(occurrence: object) -> None:
    with pytest.raises(ValueError, match="from 1"):
        step_key("default", TASK_ID, "stripe.charge", occurrence)  # type: ignore[arg-type]


@pytest.mark.parametrize(("task_id", "name"), [("", "x.y"), (TASK_ID, ""), (TASK_ID, "a\ud800")])
def test_an_empty_or_broken_component_is_refused(task_id: str, name: str) -> None:
    with pytest.raises(ValueError):
        step_key("default", task_id, name, 1)


# -- business-key rules -----------------------------------------------------------

REFUSED = [
    pytest.param("order\u200b1", "control-or-format", 5, id="zero-width-space"),
    pytest.param("\u202eorder-1", "control-or-format", 0, id="right-to-left-override"),
    pytest.param("\ufefforder-1", "control-or-format", 0, id="byte-order-mark"),
    pytest.param("order\t1", "control-or-format", 5, id="tab"),
    pytest.param("order-1\n", "control-or-format", 7, id="newline"),
    pytest.param("cafe\u0301", "not-nfc", 3, id="e-plus-combining-acute"),
    pytest.param(" order-1", "edge-or-double-space", 0, id="leading-space"),
    pytest.param("order-1 ", "edge-or-double-space", 7, id="trailing-space"),
    pytest.param("order  1", "edge-or-double-space", 5, id="double-space"),
    pytest.param(" ", "edge-or-double-space", 0, id="only-a-space"),
    pytest.param("order\u00a01", "non-ascii-space", 5, id="no-break-space"),
    pytest.param("order\u30001", "non-ascii-space", 5, id="ideographic-space"),
    pytest.param("order\u20281", "non-ascii-space", 5, id="line-separator"),
    pytest.param("order\u20291", "non-ascii-space", 5, id="paragraph-separator"),
    pytest.param("order-\u2764\ufe0f", "invisible", 7, id="emoji-with-variation-selector-16"),
    pytest.param("order\U000e01001", "invisible", 5, id="variation-selector-supplement"),
    pytest.param("order\u31641", "invisible", 5, id="hangul-filler"),
    pytest.param("\u115forder", "invisible", 0, id="hangul-choseong-filler"),
    pytest.param("order\uffa0", "invisible", 5, id="halfwidth-hangul-filler"),
    pytest.param("order\u034f1", "invisible", 5, id="combining-grapheme-joiner"),
    pytest.param("order\u28001", "invisible", 5, id="braille-blank"),
    pytest.param("order\ue0001", "private-use", 5, id="private-use"),
    pytest.param("order\U000f00001", "private-use", 5, id="supplementary-private-use"),
    pytest.param("order\ufdd01", "noncharacter", 5, id="noncharacter-fdd0"),
    pytest.param("order\ufffe", "noncharacter", 5, id="noncharacter-fffe"),
    pytest.param("order\U0001ffff", "noncharacter", 5, id="noncharacter-plane-1"),
    pytest.param("order\u0378", "unassigned", 5, id="unassigned"),
    pytest.param("order\ud800", "lone-surrogate", 5, id="lone-surrogate"),
    pytest.param("order\ufffd", "replacement-character", 5, id="replacement-character"),
    pytest.param("", "empty", 0, id="empty"),
    pytest.param("x" * 513, "too-long", 512, id="too-long"),
]


@pytest.mark.parametrize(("text", "rule", "position"), REFUSED)
def test_every_refused_class_names_its_rule_and_position(
    text: str, rule: str, position: int
) -> None:
    with pytest.raises(InvalidBusinessKeyError) as caught:
        validate_business_key(text)
    assert caught.value.rule == rule
    assert caught.value.position == position
    assert rule in str(caught.value)


@pytest.mark.parametrize("value", [None, 42, b"order-1", ["order-1"]])
def test_a_business_key_that_is_not_a_str_is_refused(value: object) -> None:
    with pytest.raises(InvalidBusinessKeyError) as caught:
        validate_business_key(value)  # type: ignore[arg-type]
    assert caught.value.rule == "not-a-string"
    assert caught.value.position is None


@pytest.mark.parametrize(
    "text",
    [
        "order-1",
        "order 1",
        "Order:2024/17#a%b",
        "café",
        "注文-7",
        "Ünïcödé — ok",
        "🙂",
        "x" * 512,
        "ｏｒｄｅｒ",
    ],
)
def test_an_accepted_key_is_returned_unchanged(text: str) -> None:
    assert validate_business_key(text) is text


def test_the_message_says_what_to_do_and_never_quotes_the_key() -> None:
    secret = "alice@example.com\u00a0order"
    with pytest.raises(InvalidBusinessKeyError) as caught:
        validate_business_key(secret)
    message = str(caught.value)
    assert "alice" not in message
    assert "U+00A0" in message and "index 17" in message
    assert "U+0020" in message


def test_the_not_nfc_message_tells_to_normalize_and_never_fold_case() -> None:
    with pytest.raises(InvalidBusinessKeyError) as caught:
        validate_business_key("e\u0301")
    assert "NFC" in str(caught.value)
    assert "never fold case" in str(caught.value)


def test_the_refusal_pickles_with_its_rule_for_celery_result_backends() -> None:
    with pytest.raises(InvalidBusinessKeyError) as caught:
        validate_business_key("order\u200b1")
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (copy.rule, copy.position, copy.code_point) == ("control-or-format", 5, "U+200B")
    assert str(copy) == str(caught.value)


def test_the_public_validate_business_key_is_this_one() -> None:
    assert celery_agboss.validate_business_key is validate_business_key


def test_every_rule_id_is_a_stable_kebab_case_string() -> None:
    assert {rule.value for rule in KeyRule} == {
        "not-a-string",
        "empty",
        "too-long",
        "control-or-format",
        "lone-surrogate",
        "not-nfc",
        "non-ascii-space",
        "edge-or-double-space",
        "invisible",
        "private-use",
        "noncharacter",
        "unassigned",
        "replacement-character",
    }


# -- fitting a key to a gateway's limit (#532) ------------------------------------

LONG_KEY = "default:b:order%3A1:stripe.charge"
LONG_KEY_DIGEST = "_4wakQZ_CpTwBGX3mv5iKz3RL1KzmAWy0JfmpB_xyRM"  # openssl, independently


def test_a_key_that_fits_is_sent_unchanged() -> None:
    assert fit_key(LONG_KEY, None) == LONG_KEY
    assert fit_key(LONG_KEY, len(LONG_KEY)) == LONG_KEY
    assert fit_key(LONG_KEY, 255) == LONG_KEY


def test_a_key_too_long_becomes_the_digest_of_the_whole_key_never_a_cut_key() -> None:
    assert fit_key(LONG_KEY, 32) == LONG_KEY_DIGEST[:32]
    assert len(LONG_KEY_DIGEST) == keys.DIGEST_LENGTH


def test_a_limit_above_the_digest_gets_the_whole_digest() -> None:
    long_key = LONG_KEY + "x" * 100
    fitted = fit_key(long_key, 64)
    assert len(fitted) == 43
    assert fitted == fit_key(long_key, 100)


def test_only_the_digest_is_ever_cut_for_a_25_character_gateway() -> None:
    first = business_key("default", "order-" + "1" * 40, "cardcom.charge")
    second = business_key("default", "order-" + "1" * 39 + "2", "cardcom.charge")
    assert first[:25] == second[:25]  # cutting the key would make two orders one payment
    assert fit_key(first, 25) != fit_key(second, 25)
    assert len(fit_key(first, 25)) == 25


@pytest.mark.parametrize("limit", [0, 8, 15, True])
def test_a_limit_too_short_for_a_safe_digest_is_refused(limit: int) -> None:
    with pytest.raises(ValueError, match="16"):
        fit_key(LONG_KEY, limit)


# -- keyed digests ----------------------------------------------------------------


def test_the_fingerprint_is_pinned() -> None:
    request = {"order": "é", "currency": "usd", "amount": 1000}
    assert fingerprint(PSEUDONYM_KEY, request) == (
        "2c626048fab487f2df6168f3abc164cf4c57cbb3a9634fdf70186b35c2b2e4e4"
    )


def test_the_business_key_handle_is_pinned_and_differs_from_a_fingerprint() -> None:
    handle = business_key_handle(PSEUDONYM_KEY, "order:1")
    assert handle == "cbc08dba31153ad288e831455094ceda62b82b957be2652784db73caf91c6b95"
    assert handle != fingerprint(PSEUDONYM_KEY, "order:1")


def test_another_pseudonym_key_gives_other_fingerprints_and_handles() -> None:
    other = b"fedcba9876543210fedcba9876543210"
    assert fingerprint(PSEUDONYM_KEY, {"a": 1}) != fingerprint(other, {"a": 1})
    assert business_key_handle(PSEUDONYM_KEY, "o") != business_key_handle(other, "o")


def test_a_changed_request_changes_the_fingerprint() -> None:
    assert fingerprint(PSEUDONYM_KEY, {"amount": 1000}) != fingerprint(
        PSEUDONYM_KEY, {"amount": 1001}
    )
    assert fingerprint(PSEUDONYM_KEY, {"amount": 1}) != fingerprint(PSEUDONYM_KEY, {"amount": "1"})


def test_a_request_json_cannot_hold_is_refused_naming_its_path() -> None:
    with pytest.raises(TypeError, match=r"\$\.items\[0\]\.amount"):
        fingerprint(PSEUDONYM_KEY, {"items": [{"amount": float("nan")}]})


def test_a_raw_or_short_key_is_refused_by_the_digests() -> None:
    with pytest.raises(ConfigurationError):
        fingerprint(b"short", {})
    with pytest.raises(ConfigurationError):
        business_key_handle("0123456789abcdef0123456789abcdef", "o")  # type: ignore[arg-type]


# -- the pseudonym key setting ------------------------------------------------------


def test_a_generated_pseudonym_key_is_accepted_as_its_utf8_bytes() -> None:
    value = "q2Xn1k8D3m9vT0yZbW7cL5aR4sE6uH2jP1oI0nM8lK7"
    assert pseudonym_key_bytes(value) == value.encode()
    assert pseudonym_key_bytes(PSEUDONYM_KEY) == PSEUDONYM_KEY


@pytest.mark.parametrize("value", ["", b"", "too-short", b"0123456789abcde"])
def test_an_empty_or_short_pseudonym_key_says_how_to_generate_one(value: str | bytes) -> None:
    with pytest.raises(ConfigurationError) as caught:
        pseudonym_key_bytes(value)
    assert "secrets.token_urlsafe(32)" in str(caught.value)


def test_a_pseudonym_key_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="whitespace"):
        pseudonym_key_bytes("0123456789abcdef0123456789abcdef\n")


def test_a_pseudonym_key_of_another_type_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="str or bytes"):
        pseudonym_key_bytes(None)  # type: ignore[arg-type]
