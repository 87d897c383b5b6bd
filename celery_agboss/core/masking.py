"""Masking: what of a request, a result or an error text is never written to the store.

A policy names dotted field paths (``"card.number"``, ``"customer.email"``,
``"items.*.card"``) whose values are replaced by the fixed marker ``"***"`` before
anything is stored. It also names the fields reconcile needs kept (reconcile only
ever sees the stored, masked request), and refuses at construction a path that is
both masked and kept: a policy that hides what reconcile must read would turn every
unknown outcome into a question for an operator.

Masking fails closed: any error while masking (a bad shape, a value JSON cannot
hold, a custom ``mask_errors`` that raises or returns a non-string) raises
``MaskingPolicyError`` naming the field and the policy, and nothing is stored. The
one exception is the engine's, at settle, where the money has already moved: it
calls ``try_mask_result`` and stores a not-stored marker instead of failing.
Messages never quote the value being masked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.canonical import ensure_json
from celery_agboss.core.protections import (
    LISTS_NOT_MASKED_ELEMENT_WISE,
    MASKING_OVERLAP_BY_POSITION,
)
from celery_agboss.core.store_protocol import JSON
from celery_agboss.errors import MaskingPolicyError

__all__ = [
    "MASK",
    "NO_MASKING",
    "RESULT_NOT_STORED_KEY",
    "MaskingPolicy",
]

MASK = "***"
"""What a masked value becomes, whatever its type (a string, a number, a whole object)."""

RESULT_NOT_STORED_KEY = "agboss_result_not_stored"
"""``try_mask_result`` answers ``(False, {RESULT_NOT_STORED_KEY: reason})`` on failure."""

_Path = tuple[str, ...]


def _parse(path: object, policy: str) -> _Path:
    if not isinstance(path, str) or not path:
        raise MaskingPolicyError(
            f"{policy}: a field path must be a non-empty dotted str, not {path!r}",
            policy=policy,
            field=str(path),
        )
    if path != path.strip() or path.startswith("$") or "[" in path or "]" in path:
        # The forms of other path languages (``$.card.number``, ``items[0].card``) and a
        # stray space match no field here: accepted, they would mask nothing.
        raise MaskingPolicyError(
            f"{policy}: the field path {path!r} would match nothing; write it dotted from "
            "the root without '$', brackets or spaces: 'card.number', 'items.0.card', "
            "'items.*.card'",
            policy=policy,
            field=path,
        )
    segments = tuple(path.split("."))
    if any(not segment for segment in segments):
        raise MaskingPolicyError(
            f"{policy}: the field path {path!r} has an empty segment; write 'card.number', "
            "with '*' for any key or list item",
            policy=policy,
            field=path,
        )
    return segments


def _is_index(segment: str) -> bool:
    return segment == "*" or segment.isdigit()


def _overlaps(masked: _Path, kept: _Path) -> bool:
    """True when some document has a field that both paths reach, one at or under the
    other: masking ``masked`` could then hide or change something under ``kept``.

    Each level of that document is a dict or a list. At a dict, both paths take a key
    (equal segments, or either ``*``). At a list, an index segment (``*`` or digits)
    takes the element while a field name goes on into it (lists are transparent, as
    ``_descend_into_list`` masks them), so ``items.amount`` and ``items.0.amount``
    reach the same field.
    """
    if sabotage.active(MASKING_OVERLAP_BY_POSITION):
        return all(a == b or a == "*" or b == "*" for a, b in zip(masked, kept, strict=False))
    if not masked or not kept:
        return True
    a, b = masked[0], kept[0]
    if (a == b or a == "*" or b == "*") and _overlaps(masked[1:], kept[1:]):
        return True  # a dict level (or a list level both index)
    if _is_index(a) and not _is_index(b):
        return _overlaps(masked[1:], kept)  # a list level: only ``masked`` takes the element
    if _is_index(b) and not _is_index(a):
        return _overlaps(masked, kept[1:])
    return False


def _segment_matches(segment: str, key: str | int) -> bool:
    if segment == "*":
        return True
    if isinstance(key, int):
        return segment.isdigit() and int(segment) == key
    return segment == key


class MaskingPolicy:
    """Which fields are masked at write and which reconcile needs kept.

    ``mask`` applies to requests and results alike (paths from the root of each).
    ``mask_errors`` turns an error text into what may be stored; without it, error
    texts are stored as they are, so make sure your exceptions do not quote card data.
    """

    __slots__ = ("_keep", "_mask", "_mask_errors")

    def __init__(
        self,
        mask: Iterable[str] = (),
        keep_for_reconcile: Iterable[str] = (),
        mask_errors: Callable[[str], str] | None = None,
    ) -> None:
        for name, paths in (("mask", mask), ("keep_for_reconcile", keep_for_reconcile)):
            if isinstance(paths, str) or not isinstance(paths, Iterable):
                raise MaskingPolicyError(
                    f"{name} takes a list of paths, not {type(paths).__name__}",
                    policy=name,
                )
        self._mask = tuple(_parse(path, "mask") for path in mask)
        self._keep = tuple(_parse(path, "keep_for_reconcile") for path in keep_for_reconcile)
        if mask_errors is not None and not callable(mask_errors):
            raise MaskingPolicyError(
                "mask_errors must be callable (str) -> str", policy="mask_errors"
            )
        self._mask_errors = mask_errors
        for masked in self._mask:
            for kept in self._keep:
                if _overlaps(masked, kept):
                    raise MaskingPolicyError(
                        f"the path {'.'.join(kept)!r} is kept for reconcile but "
                        f"{'.'.join(masked)!r} masks it or part of it; reconcile would get "
                        f"'{MASK}'. Mask only fields reconcile does not need",
                        policy="mask",
                        field=".".join(masked),
                    )

    @property
    def mask(self) -> tuple[str, ...]:
        return tuple(".".join(path) for path in self._mask)

    @property
    def keep_for_reconcile(self) -> tuple[str, ...]:
        return tuple(".".join(path) for path in self._keep)

    @property
    def masks_errors(self) -> bool:
        return self._mask_errors is not None

    def __repr__(self) -> str:
        return (
            f"MaskingPolicy(mask={list(self.mask)!r}, "
            f"keep_for_reconcile={list(self.keep_for_reconcile)!r}, "
            f"mask_errors={self._mask_errors!r})"
        )

    def mask_request(self, request: Any) -> JSON:
        """A masked copy of the request, as it may be stored. The input is not changed."""
        return self._mask_value(request, "request")

    def mask_result(self, result: Any) -> JSON:
        """A masked copy of a gateway's result, as it may be stored."""
        return self._mask_value(result, "result")

    def try_mask_result(self, result: Any) -> tuple[bool, JSON]:
        """``(True, masked)``, or ``(False, {RESULT_NOT_STORED_KEY: reason})`` when masking fails.

        For the settle path only: the money has moved, so the engine must record the
        intent as completed whatever happens here, with a marker an operator resolves.
        """
        try:
            return True, self.mask_result(result)
        except MaskingPolicyError as exc:
            return False, {RESULT_NOT_STORED_KEY: str(exc)}

    def mask_error_value(self, value: Any) -> Any:
        """A value an error carries (an argument of a definite failure), with the fields
        ``mask`` names masked as in a request: an SDK error that keeps the request it
        refused must not store what the stored request hides (design: masking). Not held
        to JSON here (a ``Decimal`` amount stays one): what stores it decides."""
        return _copy_masked(value, self._mask)

    def mask_error_text(self, text: str) -> str:
        """The error text as it may be stored, through ``mask_errors`` when one is set."""
        if not isinstance(text, str):
            raise MaskingPolicyError(
                f"an error text must be a str, not {type(text).__name__}", policy="mask_errors"
            )
        if self._mask_errors is None:
            return text
        try:
            masked = self._mask_errors(text)
        except Exception as exc:
            # The cause is not chained: its message may quote the very text being hidden.
            raise MaskingPolicyError(
                f"mask_errors raised {type(exc).__name__}; nothing was stored",
                policy="mask_errors",
            ) from None
        if not isinstance(masked, str):
            raise MaskingPolicyError(
                f"mask_errors returned a {type(masked).__name__}, not a str; nothing was stored",
                policy="mask_errors",
            )
        return masked

    def _mask_value(self, value: Any, what: str) -> JSON:
        try:
            masked = _copy_masked(value, self._mask)
            ensure_json(masked, path="$")
        except MaskingPolicyError:
            raise
        except TypeError as exc:
            raise MaskingPolicyError(
                f"the {what} cannot be stored: {exc}", policy="mask", what=what
            ) from None
        except Exception as exc:
            raise MaskingPolicyError(
                f"masking the {what} failed with {type(exc).__name__}; nothing was stored",
                policy="mask",
                what=what,
            ) from None
        return masked  # type: ignore[no-any-return]


def _copy_masked(value: Any, paths: tuple[_Path, ...]) -> Any:
    """Copy ``value`` (containers only; scalars are immutable), masking what ``paths`` reach.

    A path that ends at a value masks it. A path that still has segments but meets a
    string or number masks that scalar too: it may hold what the path meant to hide.
    Lists are masked element-wise: ``"cards.number"`` masks the number of every card in
    a list of cards (``"cards.*.number"`` and ``"cards.0.number"`` work as well). ``None``
    and missing keys have nothing to hide.
    """
    if any(not path for path in paths):
        return MASK
    if isinstance(value, dict):
        return {key: _copy_masked(item, _descend(paths, key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [
            _copy_masked(item, _descend_into_list(paths, index)) for index, item in enumerate(value)
        ]
    if paths and value is not None:
        return MASK
    return value


def _descend(paths: tuple[_Path, ...], key: object) -> tuple[_Path, ...]:
    if not paths:
        return paths
    if not isinstance(key, (str, int)):
        return paths[:0]
    return tuple(path[1:] for path in paths if _segment_matches(path[0], key))


def _descend_into_list(paths: tuple[_Path, ...], index: int) -> tuple[_Path, ...]:
    """Into one element of a list: a path whose next segment names the element (``*`` or
    its index) moves past it; a path whose next segment is a field name goes on
    unchanged into every element (a list is transparent)."""
    if sabotage.active(LISTS_NOT_MASKED_ELEMENT_WISE):
        return _descend(paths, index)
    moved = []
    for path in paths:
        head = path[0]
        if head == "*" or head.isdigit():
            if _segment_matches(head, index):
                moved.append(path[1:])
        else:
            moved.append(path)
    return tuple(moved)


NO_MASKING = MaskingPolicy()
"""The default: nothing masked; values are still checked to be storable JSON."""
