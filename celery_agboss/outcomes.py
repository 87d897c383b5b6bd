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
import sys
from typing import Any

from celery_agboss.errors import StoredFailureError
from celery_agboss.messages import dumps, loads

MAX_MESSAGE_CHARS = 2000


def encode_result(value: Any, *, allow_pickle: bool = False) -> str:
    try:
        return dumps({"json": value})
    except (TypeError, ValueError):
        pass
    if allow_pickle:
        try:
            return dumps({"pickle": base64.b64encode(pickle.dumps(value)).decode("ascii")})
        except Exception:
            pass
    return dumps({"unstorable": _type_name(type(value))})


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


def _type_name(cls: type[Any]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def encode_error(exc: BaseException) -> str:
    try:
        args = loads(dumps(list(exc.args)))
    except (TypeError, ValueError):
        args = None
    return dumps(
        {
            "type": _type_name(type(exc)),
            "message": str(exc)[:MAX_MESSAGE_CHARS],
            "args": args,
        }
    )


def _loaded_class(name: str) -> type[BaseException] | None:
    module_name, _, qualname = name.rpartition(".")
    module = sys.modules.get(module_name)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if isinstance(target, type) and issubclass(target, Exception):
        return target
    return None


def decode_error(text: str | None) -> BaseException:
    """The stored failure as an exception to raise."""
    stored = loads(text) if text else {}
    name = str(stored.get("type") or "Exception")
    message = str(stored.get("message") or "")
    cls = _loaded_class(name)
    args = stored.get("args")
    if cls is not None and isinstance(args, list):
        try:
            return cls(*args)
        except Exception:
            pass
    return StoredFailureError(f"{name}: {message}", original_type=name)


__all__ = ["decode_error", "decode_result", "encode_error", "encode_result"]
