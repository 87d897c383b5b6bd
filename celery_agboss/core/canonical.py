"""Canonical JSON: one text per value, so fingerprints and digests are reproducible.

Two workers that build the same request must compute the same fingerprint, and a
history row read back from the store must hash to the digest it was written with.
Python's ``json.dumps`` is deterministic only once key order, separators and the
escaping of non-ASCII are pinned, and it silently accepts what JSON cannot hold
(``NaN``, ``Infinity``) or turns distinct dict keys into one (``1`` and ``"1"``).
``canonical_json`` pins the former and refuses the latter, naming the path of the
bad value so the caller can fix the data rather than guess.

What "canonical" means here is *deterministic*, not *semantic* equality: ``1`` and
``1.0`` are different texts (and so different fingerprints), as are ``0.0`` and
``-0.0``. Tuples are written as arrays, exactly like lists, because that is what
they become after a round trip through any JSON store.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["canonical_json", "ensure_json", "json_path"]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_path(parent: str, key: str | int) -> str:
    """The path of ``key`` under ``parent``, in the ``$.a.b[0]`` form used in error messages."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{parent}.{key}"
    return f"{parent}[{json.dumps(key, ensure_ascii=True)}]"


def _check_text(text: str, path: str, what: str) -> None:
    match = _SURROGATE.search(text)
    if match is not None:
        raise TypeError(
            f"{what} at {path} holds a lone surrogate (U+{ord(match.group()):04X} at index "
            f"{match.start()}), which is not valid Unicode text and cannot be stored as UTF-8"
        )


def ensure_json(value: Any, *, path: str = "$") -> None:
    """Raise ``TypeError`` naming the first path whose value plain JSON cannot represent.

    Accepted: ``None``, ``bool``, ``int``, finite ``float``, ``str`` (valid Unicode),
    ``list`` and ``tuple`` (as arrays) and ``dict`` with ``str`` keys. Anything else,
    a cycle, or a non-string key is refused, because ``json.dumps`` would either fail
    without saying where or, worse, quietly turn two different values into one text.
    """
    if not _plain(value, set()):
        _walk(value, path, set())  # names the first bad path; raises


def _plain(value: Any, seen: set[int]) -> bool:
    """Whether ``value`` is plain JSON: ``_walk``'s checks, without building a path per
    element (the hot path canonicalises every request and history row it writes; only a
    value that fails is walked again, by ``_walk``, to say where)."""
    kind = type(value)
    if kind is str:
        return _SURROGATE.search(value) is None
    if value is None or kind is int or kind is bool:
        return True
    if kind is dict or kind is list or kind is tuple:
        marker = id(value)
        if marker in seen:
            return False
        seen.add(marker)
        if kind is dict:
            for key, item in value.items():
                if type(key) is not str or _SURROGATE.search(key) is not None:
                    return False
                if not _plain(item, seen):
                    return False
        else:
            for item in value:
                if not _plain(item, seen):
                    return False
        seen.discard(marker)
        return True
    if kind is float:
        return math.isfinite(value)
    return False  # a subclass, or not JSON: _walk decides, and says where


def _walk(value: Any, path: str, seen: set[int]) -> None:
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(
                f"the value at {path} is {value!r}; JSON has no NaN or Infinity, "
                "so it cannot be fingerprinted or stored"
            )
        return
    if isinstance(value, str):
        _check_text(value, path, "the string")
        return
    if isinstance(value, (dict, list, tuple)):
        marker = id(value)
        if marker in seen:
            raise TypeError(f"the value at {path} contains itself (a circular reference)")
        seen.add(marker)
        try:
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise TypeError(
                            f"the object at {path} has a {type(key).__name__} key; JSON keys "
                            "are strings, and converting it could merge it with a string key"
                        )
                    _check_text(key, path, "a key of the object")
                    _walk(item, json_path(path, key), seen)
            else:
                for index, item in enumerate(value):
                    _walk(item, json_path(path, index), seen)
        finally:
            seen.discard(marker)
        return
    raise TypeError(
        f"the value at {path} is a {type(value).__module__}.{type(value).__qualname__}, "
        "which is not JSON; convert it to a str, number, bool, None, list or dict first"
    )


def canonical_json(value: Any) -> str:
    """The one JSON text of ``value``: keys sorted, no spaces, non-ASCII kept as is.

    Raises ``TypeError`` naming the path of the first value JSON cannot represent.
    """
    ensure_json(value)
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        check_circular=False,  # ensure_json refused cycles
    )
