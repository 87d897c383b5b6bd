"""A definite failure as the store keeps it, and the same exception raised again.

A re-run replays what earlier deliveries recorded (design: failure replay): a decline the body went
past (it caught it and charged a backup card) must be raised again on the next
delivery, never sent again. So the failure is kept with its intent: its type, its text
masked by the call's policy, and its arguments (their texts masked). It is rebuilt
only from a class this process already imported (nothing is imported because the
database says so); when it cannot be rebuilt as it was, the delivery stops instead of
taking another branch. An argument carrying the refused request is masked by the
call's field paths first, as the request is (design: masking).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from celery_agboss.core.canonical import ensure_json
from celery_agboss.core.masking import NO_MASKING, MaskingPolicy
from celery_agboss.core.store_protocol import JSON


def type_name(cls: type[Any]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def loaded_class(name: str) -> type[BaseException] | None:
    """The exception class named ``module.Qualname``, if its module is already imported."""
    module_name, _, qualname = name.rpartition(".")
    target: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if isinstance(target, type) and issubclass(target, Exception):
        return target
    return None


def text_of(exc: BaseException) -> str:
    """``str(exc)``, or what can be said of an exception whose ``__str__`` raises."""
    try:
        return str(exc)
    except Exception as broken:
        return f"<{type(exc).__name__}: str() raised {type(broken).__name__}>"


FieldMask = Callable[[Any], Any]
"""A call's field masking of a value an error carries (``MaskingPolicy.mask_error_value``)."""

MESSAGE_NOT_STORED = "<not stored: the error's text may quote a field the masking policy hides>"


def field_mask(policy: MaskingPolicy) -> FieldMask | None:
    """The policy's field masking for error arguments, or None when it masks no field."""
    return policy.mask_error_value if policy.mask else None


def encode_failure(
    exc: BaseException, mask_text: Callable[[str], str], mask_fields: FieldMask | None = None
) -> JSON:
    """What the store keeps of a definite failure: type, masked text, masked arguments
    (None when they cannot be stored as JSON: then it is rebuilt from its text alone)."""
    args: JSON = None
    try:
        fielded, _ = _fielded(_constructor_args(exc), mask_fields)
        candidate = [masked_value(arg, mask_text) for arg in fielded]
        ensure_json(candidate)
        args = candidate
    except Exception:
        args = None  # not JSON, or the policy failed: nothing of them is stored (fail closed)
    return {
        "type": type_name(type(exc)),
        "message": stored_text(exc, mask_text, mask_fields),
        "args": args,
    }


def stored_text(
    exc: BaseException, mask_text: Callable[[str], str], mask_fields: FieldMask | None = None
) -> str:
    """The exception's text as the store may keep it (design: masking). An SDK error that
    carries the refused request may quote it in its text: when the call's field masking
    changes an argument, the text is that of the exception made again from the masked
    arguments (its own reason kept, the request's fields masked); when it cannot be made
    again, the text is not stored (it may quote them)."""
    text = text_of(exc)
    if mask_fields is not None:
        try:
            fielded, changed = _fielded(_constructor_args(exc), mask_fields)
            if changed:
                text = text_of(type(exc)(*fielded))
        except Exception:
            text = MESSAGE_NOT_STORED  # the policy failed, or the class refused: fail closed
    return mask_text(text)


def masked_args(
    args: tuple[Any, ...] | list[Any],
    mask_text: Callable[[str], str] | None,
    mask_fields: FieldMask | None = None,
) -> list[Any]:
    """The arguments through the field masking, then every text through ``mask_text``."""
    fielded, _ = _fielded(tuple(args), mask_fields)
    if mask_text is None:
        return fielded
    return [masked_value(arg, mask_text) for arg in fielded]


def _fielded(args: tuple[Any, ...], mask_fields: FieldMask | None) -> tuple[list[Any], bool]:
    """Each argument's dicts through ``mask_fields``; and whether that changed one."""
    if mask_fields is None:
        return list(args), False
    out: list[Any] = []
    changed = False
    for arg in args:
        if isinstance(arg, (dict, list, tuple)):
            masked = _dicts_masked(arg, mask_fields)
            as_json = NO_MASKING.mask_error_value  # tuples as lists, on both sides
            changed = changed or as_json(masked) != as_json(arg)
            arg = masked
        out.append(arg)
    return out, changed


def _dicts_masked(value: Any, mask_fields: FieldMask) -> Any:
    """A dict through the field paths, as a request is masked from its root; the dicts in
    a list or tuple each so; any other value as it is: no path names a text in a list of
    texts (a decline's codes, the differences of another request's answer), and masking
    it would change what a replay hands the body."""
    if isinstance(value, dict):
        return mask_fields(value)
    if isinstance(value, (list, tuple)):
        return [_dicts_masked(item, mask_fields) for item in value]
    return value


def _constructor_args(exc: BaseException) -> tuple[Any, ...]:
    """What the class is called with to make ``exc`` again: its ``__reduce__`` says so
    when it calls the class itself (exceptions whose ``__init__`` takes more than their
    message, as SDK errors often do); else ``exc.args``."""
    try:
        reduced = exc.__reduce__()
    except Exception:
        return tuple(exc.args)
    if isinstance(reduced, tuple) and len(reduced) >= 2 and reduced[0] is type(exc):
        return tuple(reduced[1])
    return tuple(exc.args)


def masked_value(value: Any, mask_text: Callable[[str], str]) -> Any:
    """Every text in ``value`` through ``mask_text``; a number whose text it changes is
    kept as the masked text (a card number given as an int)."""
    if isinstance(value, dict):
        return {key: masked_value(item, mask_text) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked_value(item, mask_text) for item in value]
    if value is None or isinstance(value, bool):
        return value
    text = value if isinstance(value, str) else str(value)
    masked = mask_text(text)
    return value if masked == text else masked


def rebuild_failure(stored: JSON) -> BaseException | None:
    """The stored failure as an exception of its own class, or None when that class is
    not imported here or will not take the stored arguments."""
    if not isinstance(stored, dict):
        return None
    cls = loaded_class(str(stored.get("type") or ""))
    if cls is None:
        return None
    args = stored.get("args")
    message = str(stored.get("message") or "")
    if not isinstance(args, list) and message == MESSAGE_NOT_STORED:
        return None  # neither its arguments nor its text were kept: not as it was
    try:
        if isinstance(args, list):
            return cls(*args)
        return cls(message)
    except Exception:
        return None


__all__ = [
    "MESSAGE_NOT_STORED",
    "FieldMask",
    "encode_failure",
    "field_mask",
    "loaded_class",
    "masked_args",
    "rebuild_failure",
    "stored_text",
    "type_name",
]
