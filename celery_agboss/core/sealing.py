"""Records sealed at rest: AES-GCM with named keys, each value bound to its row.

A sealed value is text, ``agbsealed:1:<key id>:<base64 of nonce + ciphertext>``, in the
same column the plaintext would take, so a store written before encryption was turned
on keeps working: a value without the prefix is read as it is (design: sealed at rest).
The associated data names the table, the column, the row's own key known to the client
(an idempotency key, an execution id, never a serial id) and the key id, so a sealed
value copied into another row, another column or relabelled with another key does not
open. Fingerprints, handles and history digests are computed over the plaintext before
anything is sealed, so a rotation changes none of them.

The key ring comes from ``agboss_encryption_keys`` (names; the first seals, the others
only open) and each key's bytes from the environment (``key_variable``), never from
code. ``cryptography`` is imported only when a ring is built (extra ``crypto``).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.protections import SEALED_WITHOUT_ROW_BINDING
from celery_agboss.errors import (
    ConfigurationError,
    EncryptionKeysMissingError,
    SealedValueUnopenableError,
)

SEALED_PREFIX = "agbsealed:1:"
PLAIN_ESCAPE = "agbplain:"
"""Prefixed to a plaintext that happens to start like a sealed value (or like this
escape), so text from outside (an error message) can never pass for an envelope."""

ENVELOPE_START = "agb"
"""What both prefixes begin with: a stored text without it is plaintext, read as it is."""

KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12
KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
KEYS_SETTING = "agboss_encryption_keys"
ENCRYPTION_META_KEY = "encryption"
"""The ``agboss_meta`` row that says the store holds sealed values (value ``on``)."""


def key_variable(key_id: str) -> str:
    """The environment variable that holds a key's bytes (base64)."""
    return "AGBOSS_ENCRYPTION_KEY_" + re.sub(r"[^A-Za-z0-9]", "_", key_id).upper()


@dataclass(frozen=True)
class SealedAt:
    """Where a value lives: what its associated data binds it to."""

    table: str
    column: str
    row_key: str

    def associated_data(self, key_id: str) -> bytes:
        parts: tuple[str, ...] = ("agboss", "1", self.table, self.column, self.row_key, key_id)
        if sabotage.active(SEALED_WITHOUT_ROW_BINDING):
            parts = ("agboss", "1", key_id)
        return "\x00".join(parts).encode("utf-8")


class KeyRing:
    """Named AES-GCM keys; the first seals, every one opens."""

    def __init__(self, keys: Sequence[tuple[str, bytes]]) -> None:
        if not keys:
            raise ConfigurationError(f"{KEYS_SETTING} names no key", setting=KEYS_SETTING)
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                f"{KEYS_SETTING} is set but the cryptography package is not installed: "
                "pip install 'celery-agboss[crypto]'",
                setting=KEYS_SETTING,
            ) from exc
        for key_id, raw in keys:
            # AES-256 only: AESGCM would take a 16-byte key as AES-128 without a word.
            if not isinstance(raw, bytes) or len(raw) != KEY_BYTES:
                size = len(raw) if isinstance(raw, (bytes, bytearray)) else type(raw).__name__
                raise ConfigurationError(
                    f"the key {key_id!r} must be {KEY_BYTES} bytes (AES-256), not {size}",
                    setting=KEYS_SETTING,
                )
        self.key_ids = tuple(key_id for key_id, _ in keys)
        self._ciphers: dict[str, Any] = {key_id: AESGCM(raw) for key_id, raw in keys}

    @property
    def sealing_key_id(self) -> str:
        return self.key_ids[0]

    def seal(self, text: str, where: SealedAt, key_id: str | None = None) -> str:
        key_id = key_id or self.sealing_key_id
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[key_id].encrypt(
            nonce, text.encode("utf-8"), where.associated_data(key_id)
        )
        return f"{SEALED_PREFIX}{key_id}:{base64.b64encode(nonce + sealed).decode('ascii')}"

    def open(self, key_id: str, body: str, where: SealedAt) -> str:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise _unopenable(f"no configured key is named {key_id!r}", key_id, where)
        try:
            raw = base64.b64decode(body, validate=True)
            opened: bytes = cipher.decrypt(
                raw[:NONCE_BYTES], raw[NONCE_BYTES:], where.associated_data(key_id)
            )
        except Exception as exc:  # InvalidTag, a short or non-base64 body
            raise _unopenable(
                f"it does not open with key {key_id!r} (moved from another row, or altered)",
                key_id,
                where,
            ) from exc
        return opened.decode("utf-8")


def _unopenable(why: str, key_id: str, where: SealedAt) -> SealedValueUnopenableError:
    return SealedValueUnopenableError(
        f"the stored {where.table}.{where.column} value cannot be opened: {why}; the delivery "
        f"waits until a process with {KEYS_SETTING} holding that key reads it",
        key_id=key_id,
        table=where.table,
        column=where.column,
    )


def sealed_key_id(stored: str | None) -> str | None:
    """The key id in a sealed value's envelope, or None for plaintext."""
    if stored is None or not stored.startswith(SEALED_PREFIX):
        return None
    return stored[len(SEALED_PREFIX) :].split(":", 1)[0]


class Sealer:
    """What the store seals with: a ring, or none (plaintext, refused once the store is
    sealed). ``store_sealed`` holds, once learned per process, whether ``agboss_meta``
    says the store holds sealed values; a process with keys records it there, and holds
    it once it has read the row committed (``store.sealed_columns``)."""

    def __init__(self, ring: KeyRing | None = None, *, store_sealed: bool | None = None) -> None:
        self.ring = ring
        self._store_sealed = store_sealed
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.ring is not None

    @property
    def writes_plaintext(self) -> bool:
        """No keys, and the store is known not to be sealed: a text is stored as it is
        unless it begins like an envelope (``ENVELOPE_START``)."""
        return self.ring is None and self._store_sealed is False

    def needs_store_check(self) -> bool:
        return self._store_sealed is None

    @property
    def store_sealed(self) -> bool | None:
        """What ``agboss_meta`` said (or this process recorded); None: not asked yet."""
        return self._store_sealed

    def learned(self, sealed: bool) -> None:
        """What a read of ``agboss_meta`` made for another reason said: enough for a
        keyless process; one with keys still records ``on`` at its first seal."""
        if self.ring is None or sealed:
            self.store_checked(sealed)

    def store_checked(self, sealed: bool) -> None:
        with self._lock:
            self._store_sealed = sealed

    def seal(self, text: str | None, where: SealedAt) -> str | None:
        if text is None:
            return None
        if self.ring is not None:
            return self.ring.seal(text, where)
        if self._store_sealed:
            raise EncryptionKeysMissingError(
                f"the store holds sealed values ({ENCRYPTION_META_KEY}=on in agboss_meta) "
                f"and this process has no {KEYS_SETTING}: it will not write "
                f"{where.table}.{where.column} in clear; start it with the keys",
                table=where.table,
                column=where.column,
            )
        if text.startswith((SEALED_PREFIX, PLAIN_ESCAPE)):
            return PLAIN_ESCAPE + text
        return text

    def open(self, stored: str | None, where: SealedAt) -> str | None:
        if stored is None:
            return None
        if stored.startswith(SEALED_PREFIX):
            key_id, _, body = stored[len(SEALED_PREFIX) :].partition(":")
            if self.ring is None:
                raise _unopenable("this process has no encryption keys", key_id, where)
            return self.ring.open(key_id, body, where)
        if stored.startswith(PLAIN_ESCAPE):
            return stored[len(PLAIN_ESCAPE) :]
        return stored

    def reseal(self, stored: str, where: SealedAt) -> str | None:
        """The value sealed with the first key, or None when it already is."""
        ring = self.ring
        if ring is None:
            raise ConfigurationError(f"re-sealing needs {KEYS_SETTING}", setting=KEYS_SETTING)
        if sealed_key_id(stored) == ring.sealing_key_id:
            return None
        text = self.open(stored, where)
        assert text is not None
        return ring.seal(text, where)


PLAINTEXT = Sealer(store_sealed=False)
"""The sealer of a store opened without the runtime (tests, tools): plaintext, never
checks ``agboss_meta``; a sealed value it meets does not open. A connection no store
opened gets a keyless ``Sealer()`` of its engine instead, which does check
(``store.sealed_columns.sealer_of``)."""


def key_ring_from(names: object, environ: Mapping[str, str] | None = None) -> KeyRing | None:
    """The ring ``agboss_encryption_keys`` names, each key read from the environment;
    None when it names none. ConfigurationError says which key or variable is wrong."""
    env = os.environ if environ is None else environ
    ids = _key_ids(names)
    if not ids:
        return None
    keys = [(key_id, _key_bytes(key_id, env)) for key_id in ids]
    return KeyRing(keys)


def _key_ids(names: object) -> list[str]:
    if names is None or names == "":
        return []
    if isinstance(names, str):
        names = [part.strip() for part in names.split(",") if part.strip()]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigurationError(
            f"{KEYS_SETTING} must be a list of key names (the first seals), e.g. "
            '["2026-12", "2026-06"]; each key\'s bytes come from the environment',
            setting=KEYS_SETTING,
        )
    seen: dict[str, str] = {}
    for key_id in names:
        if not KEY_ID.fullmatch(key_id):
            raise ConfigurationError(
                f"{KEYS_SETTING}: {key_id!r} is not a key name (letters, digits, '_', '.', "
                "'-', at most 40, starting with a letter or digit)",
                setting=KEYS_SETTING,
            )
        variable = key_variable(key_id)
        if variable in seen:
            raise ConfigurationError(
                f"{KEYS_SETTING}: {seen[variable]!r} and {key_id!r} both read {variable}",
                setting=KEYS_SETTING,
            )
        seen[variable] = key_id
    return list(names)


def _key_bytes(key_id: str, env: Mapping[str, str]) -> bytes:
    variable = key_variable(key_id)
    encoded = env.get(variable, "").strip()
    if not encoded:
        raise ConfigurationError(
            f"{KEYS_SETTING} names {key_id!r} but {variable} is not set: set it to "
            f'{KEY_BYTES} random bytes in base64 (python -c "import base64, os; '
            'print(base64.b64encode(os.urandom(32)).decode())")',
            setting=KEYS_SETTING,
        )
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != KEY_BYTES:
        raise ConfigurationError(
            f"{variable} must be {KEY_BYTES} bytes in base64 (it decodes to {len(raw)})",
            setting=KEYS_SETTING,
        )
    return raw
