"""Properties of business keys, the key grammar and key digests, over generated inputs.

Each property is one of the two ways a key can charge twice or lose a payment: one
order that becomes two keys (a refused character slipping through), or two orders
that become one key (a grammar or digest collision).
"""

from __future__ import annotations

import random
import unicodedata
from typing import Any
from urllib.parse import unquote

from hypothesis import assume, given
from hypothesis import strategies as st

from celery_agboss.core.keys import (
    INVISIBLE_CODE_POINTS,
    business_key,
    fingerprint,
    fit_key,
    step_key,
    validate_business_key,
)
from celery_agboss.errors import InvalidBusinessKeyError

PSEUDONYM_KEY = b"0123456789abcdef0123456789abcdef"

NONCHARACTERS = [chr(cp) for cp in range(0xFDD0, 0xFDF0)] + [
    chr(plane * 0x10000 + low) for plane in range(17) for low in (0xFFFE, 0xFFFF)
]


def _accepted(text: str) -> bool:
    try:
        validate_business_key(text)
    except InvalidBusinessKeyError:
        return False
    return True


_WORD = st.text(
    alphabet=st.characters(
        categories=("L", "N", "P", "S"),
        exclude_characters="".join(map(chr, sorted(INVISIBLE_CODE_POINTS))) + "\ufffd",
    ),
    min_size=1,
    max_size=12,
)

ACCEPTED_KEYS = (
    st.lists(_WORD, min_size=1, max_size=5)
    .map(" ".join)
    .map(lambda text: unicodedata.normalize("NFC", text))
    .filter(_accepted)
)

# (the rule it must be refused by, a strategy for characters of that class)
REFUSED_CHARACTERS = st.one_of(
    st.tuples(st.just("control-or-format"), st.characters(categories=("Cc", "Cf"))),
    st.tuples(st.just("lone-surrogate"), st.characters(categories=["Cs"])),
    st.tuples(st.just("private-use"), st.characters(categories=["Co"])),
    st.tuples(st.just("noncharacter"), st.sampled_from(NONCHARACTERS)),
    st.tuples(
        st.just("unassigned"),
        st.characters(categories=["Cn"]).filter(lambda c: c not in NONCHARACTERS),
    ),
    st.tuples(
        st.just("non-ascii-space"),
        st.characters(categories=("Zs", "Zl", "Zp"), exclude_characters=" "),
    ),
    st.tuples(st.just("invisible"), st.sampled_from(sorted(INVISIBLE_CODE_POINTS)).map(chr)),
    st.tuples(st.just("replacement-character"), st.just("\ufffd")),
)

# Components rich in the characters the grammar must encode.
COMPONENT = st.one_of(
    st.text(alphabet=st.sampled_from(":#%a b~é注"), min_size=1, max_size=8),
    st.text(min_size=1, max_size=8),
)


@given(key=ACCEPTED_KEYS, refused=REFUSED_CHARACTERS, data=st.data())
def test_inserting_a_refused_character_anywhere_in_an_accepted_key_refuses_it(
    key: str, refused: tuple[str, str], data: st.DataObject
) -> None:
    rule, char = refused
    index = data.draw(st.integers(min_value=0, max_value=len(key)), label="index")
    spoiled = key[:index] + char + key[index:]
    try:
        validate_business_key(spoiled)
    except InvalidBusinessKeyError as refusal:
        assert refusal.rule == rule
        assert refusal.position == index
    else:
        raise AssertionError(f"U+{ord(char):04X} at {index} was accepted ({rule})")


@given(key=ACCEPTED_KEYS)
def test_a_space_added_at_an_edge_or_doubled_is_refused(key: str) -> None:
    for spoiled in (" " + key, key + " ", key.replace(" ", "  ", 1) if " " in key else key + "  x"):
        try:
            validate_business_key(spoiled)
        except InvalidBusinessKeyError as refusal:
            assert refusal.rule == "edge-or-double-space"
        else:
            raise AssertionError("an edge or doubled space was accepted")


@given(
    keys=st.lists(st.text(min_size=1, max_size=80), min_size=2, max_size=8, unique=True),
    limit=st.integers(min_value=16, max_value=64),
)
def test_the_digest_never_maps_two_distinct_keys_to_one(keys: list[str], limit: int) -> None:
    fitted = [fit_key(key, limit) for key in keys]
    assert len(set(fitted)) == len(keys)
    assert all(len(key) <= limit for key in fitted)
    assert fitted == [fit_key(key, limit) for key in keys]  # the same call, the same key


@given(key=ACCEPTED_KEYS, name=COMPONENT, limit=st.integers(min_value=16, max_value=64))
def test_a_digest_can_never_equal_a_key_that_fits(key: str, name: str, limit: int) -> None:
    built = business_key("default", key, name)
    fitted = fit_key(built, limit)
    if len(built) <= limit:
        assert fitted == built
    else:
        assert ":" not in fitted  # every key of the grammar has one
        assert len(fitted) == min(limit, 43)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: _shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


@given(request=st.dictionaries(st.text(max_size=6), _JSON, max_size=6), rng=st.randoms())
def test_fingerprints_are_stable_across_dict_insertion_order(
    request: dict[str, Any], rng: random.Random
) -> None:
    assert fingerprint(PSEUDONYM_KEY, request) == fingerprint(
        PSEUDONYM_KEY, _shuffled(request, rng)
    )


def _decode(key: str) -> list[str]:
    return [unquote(part, errors="strict") for part in key.split(":")]


@given(tenant=ACCEPTED_KEYS, key=ACCEPTED_KEYS, name=COMPONENT)
def test_a_business_keyed_key_splits_back_into_exactly_its_components(
    tenant: str, key: str, name: str
) -> None:
    assert _decode(business_key(tenant, key, name)) == [tenant, "b", key, name]


@given(
    tenant=ACCEPTED_KEYS,
    task_id=COMPONENT,
    name=COMPONENT,
    occurrence=st.integers(min_value=1, max_value=1000),
)
def test_a_step_keyed_key_splits_back_into_exactly_its_components(
    tenant: str, task_id: str, name: str, occurrence: int
) -> None:
    built = step_key(tenant, task_id, name, occurrence)
    last = built.rsplit(":", 1)[1]
    encoded_name, _, count = last.partition("#")
    assert _decode(built)[:3] == [tenant, "t", task_id]
    assert unquote(encoded_name) == name
    assert count == ("" if occurrence == 1 else str(occurrence))


@given(
    first=st.tuples(ACCEPTED_KEYS, ACCEPTED_KEYS, COMPONENT),
    second=st.tuples(ACCEPTED_KEYS, ACCEPTED_KEYS, COMPONENT),
)
def test_the_grammar_never_maps_two_distinct_triples_to_one_key(
    first: tuple[str, str, str], second: tuple[str, str, str]
) -> None:
    assume(first != second)
    assert business_key(*first) != business_key(*second)


@given(
    first=st.tuples(ACCEPTED_KEYS, COMPONENT, COMPONENT, st.integers(1, 5)),
    second=st.tuples(ACCEPTED_KEYS, COMPONENT, COMPONENT, st.integers(1, 5)),
)
def test_the_grammar_never_maps_two_distinct_steps_to_one_key(
    first: tuple[str, str, str, int], second: tuple[str, str, str, int]
) -> None:
    assume(first != second)
    assert step_key(*first) != step_key(*second)


@given(key=ACCEPTED_KEYS, name=COMPONENT)
def test_every_built_key_is_plain_ascii_with_only_unreserved_characters_and_separators(
    key: str, name: str
) -> None:
    built = business_key("default", key, name)
    allowed = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~%:")
    assert set(built) <= allowed


@given(st.text(alphabet=st.characters(max_codepoint=0x7F), min_size=1, max_size=80))
def test_the_plain_ascii_shortcut_refuses_nothing_the_walk_would_refuse(text: str) -> None:
    from celery_agboss.core.keys import _character_violation, _plain_ascii

    if _plain_ascii(text):
        assert _character_violation(text, "the key") is None
    else:  # only a control character or a space at an edge or twice in a row leaves it
        assert not text.isprintable() or " " in (text[0], text[-1]) or "  " in text
