"""The sealer alone (design: sealed at rest): envelopes, row binding, key rings from the
environment and the refusals that name what to set."""

from __future__ import annotations

import base64
import os

import pytest

from celery_agboss.core.sealing import (
    PLAIN_ESCAPE,
    PLAINTEXT,
    SEALED_PREFIX,
    KeyRing,
    SealedAt,
    Sealer,
    key_ring_from,
    key_variable,
    sealed_key_id,
)
from celery_agboss.errors import (
    ConfigurationError,
    EncryptionKeysMissingError,
    SealedValueUnopenableError,
    StoreUnavailableError,
)

ROW = SealedAt("agboss_executions", "result", "order-1")
RAW = {name: os.urandom(32) for name in ("a", "b")}


def _ring(*names: str) -> KeyRing:
    return KeyRing([(name, RAW[name]) for name in names])


def test_a_sealed_value_names_its_key_and_opens_only_in_its_own_row() -> None:
    sealer = Sealer(_ring("a"))
    stored = sealer.seal('{"customer": "Ada"}', ROW)
    assert stored is not None and stored.startswith(f"{SEALED_PREFIX}a:")
    assert "Ada" not in stored and sealed_key_id(stored) == "a"
    assert sealer.open(stored, ROW) == '{"customer": "Ada"}'
    for elsewhere in (
        SealedAt("agboss_executions", "result", "order-2"),
        SealedAt("agboss_executions", "error", "order-1"),
        SealedAt("agboss_pauses", "result", "order-1"),
    ):
        with pytest.raises(SealedValueUnopenableError) as raised:
            sealer.open(stored, elsewhere)
        assert raised.value.key_id == "a"  # type: ignore[attr-defined]


def test_two_seals_of_one_text_differ_and_a_relabelled_key_does_not_open() -> None:
    sealer = Sealer(_ring("a", "b"))
    first, second = sealer.seal("same", ROW), sealer.seal("same", ROW)
    assert first != second  # a fresh nonce each time
    assert first is not None
    relabelled = first.replace(f"{SEALED_PREFIX}a:", f"{SEALED_PREFIX}b:")
    with pytest.raises(SealedValueUnopenableError):
        sealer.open(relabelled, ROW)


def test_a_missing_key_is_a_store_signal_naming_the_key() -> None:
    stored = Sealer(_ring("a")).seal("x", ROW)
    with pytest.raises(SealedValueUnopenableError) as raised:
        Sealer(_ring("b")).open(stored, ROW)
    assert isinstance(raised.value, StoreUnavailableError)  # the delivery waits
    assert "'a'" in str(raised.value) and raised.value.key_id == "a"  # type: ignore[attr-defined]
    with pytest.raises(SealedValueUnopenableError, match="no encryption keys"):
        PLAINTEXT.open(stored, ROW)


def test_plaintext_is_read_as_it_is_and_text_that_looks_sealed_is_escaped() -> None:
    assert Sealer(_ring("a")).open('{"old": "row"}', ROW) == '{"old": "row"}'
    forged = f"{SEALED_PREFIX}a:AAAA"
    stored = PLAINTEXT.seal(forged, ROW)
    assert stored == PLAIN_ESCAPE + forged
    assert PLAINTEXT.open(stored, ROW) == forged
    assert PLAINTEXT.open(PLAINTEXT.seal(PLAIN_ESCAPE + "x", ROW), ROW) == PLAIN_ESCAPE + "x"


def test_a_sealed_store_refuses_plaintext_writes_from_a_process_without_keys() -> None:
    sealer = Sealer(store_sealed=True)
    with pytest.raises(EncryptionKeysMissingError, match="agboss_encryption_keys"):
        sealer.seal("x", ROW)
    assert Sealer(store_sealed=False).seal("x", ROW) == "x"


def test_reseal_moves_a_value_to_the_first_key_and_leaves_one_already_there() -> None:
    old = Sealer(_ring("a")).seal("x", ROW)
    assert old is not None
    ring = Sealer(_ring("b", "a"))
    new = ring.reseal(old, ROW)
    assert new is not None and sealed_key_id(new) == "b" and ring.open(new, ROW) == "x"
    assert ring.reseal(new, ROW) is None
    assert sealed_key_id(ring.reseal("plain", ROW)) == "b"  # type: ignore[arg-type]


def test_the_ring_reads_each_named_key_from_its_variable() -> None:
    env = {key_variable(n): base64.b64encode(RAW[n]).decode() for n in ("a", "b")}
    ring = key_ring_from("b, a", env)
    assert ring is not None and ring.key_ids == ("b", "a") and ring.sealing_key_id == "b"
    assert key_ring_from(None, env) is None and key_ring_from([], env) is None
    assert key_variable("2026-12.eu") == "AGBOSS_ENCRYPTION_KEY_2026_12_EU"


@pytest.mark.parametrize(
    ("names", "env", "says"),
    [
        (["a"], {}, "AGBOSS_ENCRYPTION_KEY_A is not set"),
        (["a"], {"AGBOSS_ENCRYPTION_KEY_A": "c2hvcnQ="}, "must be 32 bytes"),
        (["a"], {"AGBOSS_ENCRYPTION_KEY_A": "not base64!"}, "must be 32 bytes"),
        (["bad name"], {}, "is not a key name"),
        (["a-b", "a_b"], {}, "both read AGBOSS_ENCRYPTION_KEY_A_B"),
        ({"a": 1}, {}, "must be a list of key names"),
    ],
)
def test_a_wrong_key_setting_says_what_to_set(
    names: object, env: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says) as raised:
        key_ring_from(names, env)
    assert raised.value.setting == "agboss_encryption_keys"  # type: ignore[attr-defined]
    assert "c2hvcnQ" not in str(raised.value)  # a key's bytes are never echoed


@pytest.mark.parametrize("size", [16, 24, 10, 33])
def test_a_key_of_another_length_than_32_bytes_is_refused_by_the_ring(size: int) -> None:
    """AES-GCM takes 16 and 24 bytes as AES-128 and AES-192 without a word; the design
    promises AES-256, whoever builds the ring."""
    raw = os.urandom(size)
    with pytest.raises(ConfigurationError, match="must be 32 bytes") as raised:
        KeyRing([("a", RAW["a"]), ("short", raw)])
    assert raw.hex() not in str(raised.value) and "short" in str(raised.value)


def test_only_a_keyless_sealer_of_a_store_known_in_clear_writes_plaintext_unread() -> None:
    """The store's fast path (``sealed_columns``) skips the sealer only for these."""
    assert PLAINTEXT.writes_plaintext and Sealer(store_sealed=False).writes_plaintext
    assert not Sealer().writes_plaintext  # not checked yet: agboss_meta is read first
    assert not Sealer(store_sealed=True).writes_plaintext
    assert not Sealer(_ring("a"), store_sealed=False).writes_plaintext


def test_what_the_tenant_read_learned_settles_a_keyless_sealer_but_not_one_with_keys() -> None:
    """``Runtime`` reads the store's ``encryption`` row with its deployment id: a keyless
    process then needs no statement of its own; one with keys still records ``on``."""
    keyless = Sealer()
    keyless.learned(False)
    assert keyless.writes_plaintext and keyless.store_sealed is False
    refusing = Sealer()
    refusing.learned(True)
    with pytest.raises(EncryptionKeysMissingError):
        refusing.seal("x", ROW)
    keyed = Sealer(_ring("a"))
    keyed.learned(False)
    assert keyed.needs_store_check()  # it will write encryption=on at its first seal
    keyed.learned(True)
    assert not keyed.needs_store_check()
