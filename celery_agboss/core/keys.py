"""Idempotency keys: which texts may be business keys, how keys are built, and how they
are fitted to a gateway's length limit.

A key is what the gateway deduplicates on, so two rules decide whether a customer can
be charged twice:

- one order must always produce one key (two texts that *look* the same must not be
  two keys), hence ``validate_business_key`` refuses every text a person could not
  tell apart from another one (invisible, control, odd spaces, non-NFC);
- two orders must never produce one key, hence every component is percent-encoded
  before it is joined (no separator can be forged) and a key too long for the
  gateway is replaced by a digest of the *whole* key, never cut.

The key grammar is pinned by golden tests: changing it changes the keys of intents in
flight. Error messages name the rule, the index and the code point, never the key
itself (a business key may be personal data).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from celery_agboss.core import sabotage
from celery_agboss.core.canonical import canonical_json
from celery_agboss.core.protections import (
    KEY_COMPONENTS_NOT_ESCAPED,
    PSEUDONYM_KEY_WHITESPACE_ACCEPTED,
)
from celery_agboss.errors import ConfigurationError, InvalidBusinessKeyError

__all__ = [
    "DIGEST_LENGTH",
    "INVISIBLE_CODE_POINTS",
    "KEY_COLUMN_LENGTH",
    "MIN_PSEUDONYM_KEY_BYTES",
    "KeyRule",
    "business_key",
    "business_key_handle",
    "fingerprint",
    "fit_key",
    "is_business_key",
    "pseudonym_key_bytes",
    "step_key",
    "validate_business_key",
    "validate_tenant",
]

MAX_BUSINESS_KEY_LENGTH = 512
"""Code points. Real identifiers are far shorter; a longer text is almost surely a bug."""

KEY_COLUMN_LENGTH = 512
"""Characters the store's key and execution id columns hold (``store.schema``'s ``KEY``,
``store.schema_executions``'s ``_ID`` read it; core imports no SQLAlchemy). A business
key is bounded in code points *before* it is percent-encoded (up to 12 characters each)
and joined with the tenant and the call's name, so a key the rules accept can be longer:
every step's key is fitted to this too (``core.step_identity``). Changing it changes the
keys of intents in flight and needs a migration."""

DIGEST_LENGTH = 43
"""Length of an unpadded base64url SHA-256 (256 bits in 43 characters)."""

MIN_FITTED_KEY_LENGTH = 16
"""A digest cut below 16 characters (96 bits) would make collisions plausible."""

MIN_PSEUDONYM_KEY_BYTES = 16

_GENERATE_KEY_HINT = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'

# Domain separation: the same pseudonym key makes fingerprints and handles, and a
# fingerprint of the JSON string "x" must never equal the handle of a key.
_FINGERPRINT_DOMAIN = b"agboss.fingerprint.v1\x00"
_HANDLE_DOMAIN = b"agboss.business-key-handle.v1\x00"

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


class KeyRule(str, enum.Enum):
    """Stable ids of the business-key rules (``InvalidBusinessKeyError.rule``)."""

    NOT_A_STRING = "not-a-string"
    EMPTY = "empty"
    TOO_LONG = "too-long"
    CONTROL_OR_FORMAT = "control-or-format"  # #538
    LONE_SURROGATE = "lone-surrogate"  # #538
    NOT_NFC = "not-nfc"  # #538
    NON_ASCII_SPACE = "non-ascii-space"  # #547
    EDGE_OR_DOUBLE_SPACE = "edge-or-double-space"  # #547
    INVISIBLE = "invisible"  # #556
    PRIVATE_USE = "private-use"  # #556
    NONCHARACTER = "noncharacter"  # #556
    UNASSIGNED = "unassigned"  # #556
    REPLACEMENT_CHARACTER = "replacement-character"


def _code_point_set(*ranges: tuple[int, int]) -> frozenset[int]:
    return frozenset(cp for low, high in ranges for cp in range(low, high + 1))


INVISIBLE_CODE_POINTS = _code_point_set(
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x115F, 0x1160),  # Hangul choseong / jungseong fillers
    (0x17B4, 0x17B5),  # Khmer inherent vowels (default ignorable)
    (0x180B, 0x180D),  # Mongolian free variation selectors 1-3
    (0x180F, 0x180F),  # Mongolian free variation selector 4
    (0x2800, 0x2800),  # braille pattern blank
    (0x3164, 0x3164),  # Hangul filler
    (0xFE00, 0xFE0F),  # variation selectors (U+FE0F: emoji presentation)
    (0xFFA0, 0xFFA0),  # halfwidth Hangul filler
    (0xE0100, 0xE01EF),  # variation selectors supplement
)
"""Assigned, not control/format, yet rendered as nothing (or as blank space).

Default-ignorable code points of category Cf or Cn are caught by their own rules.
"""

_ADVICE = {
    KeyRule.CONTROL_OR_FORMAT: "control and format characters (zero-width space, bidi "
    "controls, BOM, soft hyphen…) are invisible or reorder text; strip them where the "
    "identifier enters your system",
    KeyRule.LONE_SURROGATE: "a lone surrogate is not valid Unicode text (usually a "
    "decoding bug); decode the identifier correctly where it enters your system",
    KeyRule.NOT_NFC: "the same text has more than one encoding (e.g. 'e' + U+0301 and "
    "U+00E9); apply unicodedata.normalize('NFC', text) where the identifier enters your "
    "system, and never fold case or width afterwards",
    KeyRule.NON_ASCII_SPACE: "only U+0020 SPACE is allowed as a space; replace other "
    "spaces and line or paragraph separators with U+0020 where the identifier enters "
    "your system",
    KeyRule.EDGE_OR_DOUBLE_SPACE: "trim spaces at both ends and collapse runs of spaces "
    "to one U+0020 where the identifier enters your system",
    KeyRule.INVISIBLE: "this character renders as nothing (variation selector, Hangul "
    "filler, combining grapheme joiner, braille blank…); strip it where the identifier "
    "enters your system",
    KeyRule.PRIVATE_USE: "private-use characters mean different things to different "
    "systems; do not use them in business keys",
    KeyRule.NONCHARACTER: "noncharacters are reserved for internal use and must not be "
    "interchanged; remove it",
    KeyRule.UNASSIGNED: "the code point is unassigned in this Python's Unicode database "
    f"({unicodedata.unidata_version}); remove it, or run every worker on the same Python",
    KeyRule.REPLACEMENT_CHARACTER: "U+FFFD marks text that failed to decode, so different "
    "inputs end up as the same key; decode the identifier correctly (never with "
    "errors='replace')",
}


@dataclass(frozen=True)
class _Violation:
    rule: KeyRule
    position: int | None
    message: str
    code_point: str | None = None


def _describe(char: str) -> str:
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X}" + (f" {name}" if name else "")


def _is_noncharacter(cp: int) -> bool:
    return 0xFDD0 <= cp <= 0xFDEF or (cp & 0xFFFE) == 0xFFFE


def _char_rule(char: str) -> KeyRule | None:
    cp = ord(char)
    category = unicodedata.category(char)
    if category == "Cs":
        return KeyRule.LONE_SURROGATE
    if category in ("Cc", "Cf"):
        return KeyRule.CONTROL_OR_FORMAT
    if _is_noncharacter(cp):
        return KeyRule.NONCHARACTER
    if category == "Co":
        return KeyRule.PRIVATE_USE
    if category == "Cn":
        return KeyRule.UNASSIGNED
    if category in ("Zl", "Zp") or (category == "Zs" and cp != 0x20):
        return KeyRule.NON_ASCII_SPACE
    if cp in INVISIBLE_CODE_POINTS:
        return KeyRule.INVISIBLE
    if cp == 0xFFFD:
        return KeyRule.REPLACEMENT_CHARACTER
    return None


def _plain_ascii(text: str) -> bool:
    """Printable ASCII with no space at an edge and no two in a row: no rule below can
    refuse it (every other rule is about a code point beyond ASCII, and ASCII is NFC), so
    the common key skips the walk over its characters."""
    return (
        text.isascii()
        and text.isprintable()
        and text[0] != " "
        and text[-1] != " "
        and "  " not in text
    )


def _find_violation(text: object, what: str) -> _Violation | None:
    if not isinstance(text, str):
        return _Violation(
            KeyRule.NOT_A_STRING,
            None,
            f"{what} must be a str, not {type(text).__name__}; format it once, in one way, "
            "where the identifier enters your system",
        )
    if not text:
        return _Violation(KeyRule.EMPTY, 0, f"{what} is empty; an empty key identifies nothing")
    if len(text) > MAX_BUSINESS_KEY_LENGTH:
        return _Violation(
            KeyRule.TOO_LONG,
            MAX_BUSINESS_KEY_LENGTH,
            f"{what} has {len(text)} characters, more than {MAX_BUSINESS_KEY_LENGTH}; use a "
            "short stable identifier (an order id), not a document",
        )
    if _plain_ascii(text):
        return None
    return _character_violation(text, what)


def _character_violation(text: str, what: str) -> _Violation | None:
    """The first character (or the normal form) that a rule refuses, walking them all."""
    last = len(text) - 1
    for index, char in enumerate(text):
        rule = _char_rule(char)
        if rule is None and char == " ":
            if index == 0 or index == last:
                rule = KeyRule.EDGE_OR_DOUBLE_SPACE
                detail = f"a space at the {'start' if index == 0 else 'end'} (index {index})"
            elif text[index + 1] == " ":
                rule = KeyRule.EDGE_OR_DOUBLE_SPACE
                detail = f"two spaces in a row at index {index}"
            else:
                continue
            return _Violation(rule, index, f"{what} has {detail}: {_ADVICE[rule]}", "U+0020")
        if rule is not None:
            return _Violation(
                rule,
                index,
                f"{what} has {_describe(char)} at index {index}: {_ADVICE[rule]}",
                f"U+{ord(char):04X}",
            )
    if not unicodedata.is_normalized("NFC", text):
        normal = unicodedata.normalize("NFC", text)
        index = next(
            (i for i, (a, b) in enumerate(zip(text, normal, strict=False)) if a != b), len(normal)
        )
        index = min(index, last)
        return _Violation(
            KeyRule.NOT_NFC,
            index,
            f"{what} is not in Unicode normalization form C from index {index} "
            f"({_describe(text[index])}): {_ADVICE[KeyRule.NOT_NFC]}",
            f"U+{ord(text[index]):04X}",
        )
    return None


def validate_business_key(text: str) -> str:
    """Return ``text`` unchanged, or raise ``InvalidBusinessKeyError`` naming the rule.

    Nothing is ever normalized here: a key that needs fixing is refused, because a
    fix applied on one path and not another would make one order two keys.
    """
    return _validated(text, "the business key", "business key", InvalidBusinessKeyError)


def validate_tenant(text: str) -> str:
    """Return the tenant unchanged, or raise ``ConfigurationError`` (same rules as keys)."""
    what = "the tenant (agboss_tenant)"
    return _validated(text, what, "tenant", ConfigurationError, setting="agboss_tenant")


def _validated(
    text: str, what: str, name: str, error: Callable[..., Exception], **fields: str
) -> str:
    """``text`` unchanged, or ``error`` raised naming the rule it breaks."""
    violation = _find_violation(text, what)
    if violation is not None:
        raise error(
            f"{name} refused ({violation.rule.value}): {violation.message}",
            rule=violation.rule.value,
            position=violation.position,
            code_point=violation.code_point,
            **fields,
        )
    return text


def encode_component(text: str) -> str:
    """Percent-encode every byte of the UTF-8 text except RFC 3986 unreserved characters.

    ``:`` and ``#`` are always encoded, so a joined key splits back into exactly its
    components: the grammar is injective.
    """
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"a key component holds a lone surrogate at index {exc.start}; it is not text"
        ) from None
    if sabotage.active(KEY_COMPONENTS_NOT_ESCAPED):
        return text
    return "".join(chr(byte) if byte in _UNRESERVED else f"%{byte:02X}" for byte in data)


def _component(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty str, not {value!r}")
    return encode_component(value)


def step_key(tenant: str, task_id: str, name: str, occurrence: int) -> str:
    """``<tenant>:t:<task id>:<name>[#n]`` — the key of the n-th call of ``name`` in a run.

    ``occurrence`` counts from 1; the first call has no suffix. Fenced effects use the
    same grammar with the effect's name.
    """
    if isinstance(occurrence, bool) or not isinstance(occurrence, int) or occurrence < 1:
        raise ValueError(f"occurrence counts calls from 1, not {occurrence!r}")
    suffix = "" if occurrence == 1 else f"#{occurrence}"
    return ":".join(
        (
            encode_component(validate_tenant(tenant)),
            "t",
            _component(task_id, "the task id"),
            _component(name, "the call's name") + suffix,
        )
    )


def business_key(tenant: str, business_key: str, name: str) -> str:
    """``<tenant>:b:<business key>:<name>`` — the same key from any task that names the order."""
    return ":".join(
        (
            encode_component(validate_tenant(tenant)),
            "b",
            encode_component(validate_business_key(business_key)),
            _component(name, "the call's name"),
        )
    )


def is_business_key(key: str) -> bool:
    """Whether a key of the grammar is business-keyed (``<tenant>:b:…``): its record may
    be shared by several executions. Components are percent-encoded, so the second one
    is ``b`` exactly then. (A digest made by ``fit_key`` is not: an intent's row keeps its
    business key's handle instead, and a fenced effect's step knows its business key.)"""
    parts = key.split(":")
    return len(parts) == 4 and parts[1] == "b"


def fit_key(key: str, max_length: int | None) -> str:
    """``key`` when it fits, else the unpadded base64url SHA-256 of the whole key,
    cut to ``max_length`` only when even the digest is too long (#532).

    A cut key could make two orders one payment; a cut digest still separates them
    with all its remaining bits. Keys of the grammar always contain ``:`` and digests
    never do, so a key that fits can never equal another key's digest.
    """
    if max_length is None:
        return key
    if (
        isinstance(max_length, bool)
        or not isinstance(max_length, int)
        or max_length < MIN_FITTED_KEY_LENGTH
    ):
        raise ValueError(
            f"max_length {max_length!r} is below {MIN_FITTED_KEY_LENGTH}: a digest that "
            "short could give two calls one key"
        )
    if len(key) <= max_length:
        return key
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    text = base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
    return text[:max_length]


def _surrounding_whitespace(value: str | bytes) -> bool:
    """Whitespace around a key that is text. Random binary bytes (not UTF-8) are not text
    and may begin or end with any byte; the same bytes as UTF-8 text are held to the
    rule for ``str``, so ``read_bytes()`` of a secrets file is refused as ``read_text()``."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return value != value.strip()


def pseudonym_key_bytes(value: str | bytes | bytearray) -> bytes:
    """The HMAC key from a setting; refuses what would silently differ between workers."""
    if isinstance(value, bytearray):
        value = bytes(value)
    if not isinstance(value, (str, bytes)):
        raise ConfigurationError(
            f"agboss_pseudonym_key must be a str or bytes, not {type(value).__name__}; "
            f"generate one with: {_GENERATE_KEY_HINT}",
            setting="agboss_pseudonym_key",
        )
    if _surrounding_whitespace(value) and not sabotage.active(PSEUDONYM_KEY_WHITESPACE_ACCEPTED):
        raise ConfigurationError(
            "agboss_pseudonym_key has leading or trailing whitespace (a newline read from "
            "a file?); every worker must use byte-for-byte the same key (A8). Strip it.",
            setting="agboss_pseudonym_key",
        )
    data = value.encode("utf-8", "strict") if isinstance(value, str) else value
    if len(data) < MIN_PSEUDONYM_KEY_BYTES:
        raise ConfigurationError(
            f"agboss_pseudonym_key is {'empty' if not data else f'{len(data)} bytes'}; it needs "
            f"at least {MIN_PSEUDONYM_KEY_BYTES} random bytes. Generate one with: "
            f"{_GENERATE_KEY_HINT}",
            setting="agboss_pseudonym_key",
        )
    return data


def _hmac_hex(pseudonym_key: bytes, domain: bytes, message: bytes) -> str:
    if not isinstance(pseudonym_key, bytes) or len(pseudonym_key) < MIN_PSEUDONYM_KEY_BYTES:
        raise ConfigurationError(
            "the pseudonym key must be bytes from pseudonym_key_bytes(); "
            f"generate one with: {_GENERATE_KEY_HINT}",
            setting="agboss_pseudonym_key",
        )
    return hmac.new(pseudonym_key, domain + message, hashlib.sha256).hexdigest()


def fingerprint(pseudonym_key: bytes, request: object) -> str:
    """HMAC-SHA256 (hex) of the canonical JSON of the *unmasked* request.

    Keyed, so the stored fingerprint reveals nothing about the request to someone
    without the pseudonym key. Raises ``TypeError`` naming the path of a non-JSON value.
    """
    return _hmac_hex(pseudonym_key, _FINGERPRINT_DOMAIN, canonical_json(request).encode("utf-8"))


def business_key_handle(pseudonym_key: bytes, business_key: str) -> str:
    """HMAC-SHA256 (hex) of the business key: findable by who holds the key, opaque to others."""
    if not isinstance(business_key, str):
        raise TypeError(f"business_key must be a str, not {type(business_key).__name__}")
    return _hmac_hex(pseudonym_key, _HANDLE_DOMAIN, business_key.encode("utf-8"))
