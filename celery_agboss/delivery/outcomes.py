"""How a task's result and failure are kept, so a late duplicate can hand them back.

A duplicate delivery of a terminal execution never runs the body: it returns the
stored result or raises the stored failure. Results are kept in kombu's JSON (the
same values a JSON result backend accepts); with ``result_serializer = "pickle"``
a value JSON cannot hold is pickled instead. A failure keeps its type, message and
JSON-able arguments; it is rebuilt only from a class already imported in this
process (nothing is imported because the database says so), else it comes back
as ``StoredFailureError`` naming the original type.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Callable
from typing import Any

from celery_agboss.core.failures import (
    FieldMask,
    loaded_class,
    masked_args,
    stored_text,
    type_name,
)
from celery_agboss.errors import ResultNotStorableError, StoredFailureError
from celery_agboss.runtime.messages import dumps, loads

MAX_MESSAGE_CHARS = 2000


def encode_result(value: Any, *, allow_pickle: bool = False) -> str:
    """The result as the store keeps it; ``ResultNotStorableError`` when it cannot be kept
    (then the execution must not be recorded as done: a duplicate could not return it)."""
    try:
        return dumps({"json": value})
    except (TypeError, ValueError):
        pass
    if allow_pickle:
        try:
            return dumps({"pickle": base64.b64encode(pickle.dumps(value)).decode("ascii")})
        except Exception:
            pass
    kind = type_name(type(value))
    raise ResultNotStorableError(
        f"the task returned a {kind}, which cannot be stored as JSON"
        + ("" if allow_pickle else ' (nor pickled: result_serializer is not "pickle")')
        + "; nothing was recorded as done. Return JSON (a dict of strings and numbers, e.g. "
        'the gateway\'s id), or set result_serializer = "pickle"',
        result_type=kind,
    )


def decode_result(text: str | None, *, allow_pickle: bool = False) -> Any:
    """The stored result; StoredFailureError when it could not be kept."""
    stored = loads(text) if text else {"json": None}
    if "json" in stored:
        return stored["json"]
    if "pickle" in stored and allow_pickle:
        # Our own store, and only when the app already trusts pickle for results.
        return pickle.loads(base64.b64decode(str(stored["pickle"])))
    raise StoredFailureError(
        "the execution completed, but its result could not be stored "
        f"({stored.get('unstorable', 'pickled')}); the effects are recorded in the store",
        result_type=stored.get("unstorable"),
    )


def encode_error(
    exc: BaseException,
    mask_text: Callable[[str], str] | None = None,
    mask_fields: FieldMask | None = None,
) -> str:
    """The failure as the store keeps it. ``mask_fields`` (the field paths of the
    delivery's calls) passes over every dict or list argument first, as over a request;
    ``mask_text`` (their error masking) then over the message and every text in the
    arguments, so a decline that quotes a card number or carries the refused request is
    stored masked (design: masking). The message is masked before it is cut: a card
    number across the cut would escape the mask."""
    try:
        args = loads(dumps(masked_args(exc.args, None, mask_fields)))
        if mask_text is not None and isinstance(args, list):
            args = masked_args(args, mask_text)
    except Exception:
        args = None  # not JSON, or the policy failed: nothing of them is stored (fail closed)
    message = stored_text(exc, mask_text or _as_is, mask_fields)[:MAX_MESSAGE_CHARS]
    return dumps({"type": type_name(type(exc)), "message": message, "args": args})


def _as_is(text: str) -> str:
    return text


def decode_error(text: str | None) -> BaseException:
    """The stored failure as an exception to raise."""
    stored = loads(text) if text else {}
    name = str(stored.get("type") or "Exception")
    message = str(stored.get("message") or "")
    cls = loaded_class(name)
    args = stored.get("args")
    if cls is not None and isinstance(args, list):
        try:
            return cls(*args)
        except Exception:
            pass
    return StoredFailureError(f"{name}: {message}", original_type=name)


__all__ = ["decode_error", "decode_result", "encode_error", "encode_result"]
