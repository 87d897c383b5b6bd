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

from celery_agboss.core.failures import loaded_class, masked_value, text_of, type_name
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


def encode_error(exc: BaseException, mask_text: Callable[[str], str] | None = None) -> str:
    """The failure as the store keeps it. ``mask_text`` (the delivery's calls' masking)
    passes over the message and every text in the arguments, so a decline that quotes a
    card number is stored masked (design: masking); an argument it changes is kept as the
    masked text."""
    try:
        args = loads(dumps(list(exc.args)))
    except (TypeError, ValueError):
        args = None
    message = text_of(exc)[:MAX_MESSAGE_CHARS]
    if mask_text is not None:
        message = mask_text(message)
        if args is not None:
            args = [masked_value(arg, mask_text) for arg in args]
    return dumps({"type": type_name(type(exc)), "message": message, "args": args})


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
