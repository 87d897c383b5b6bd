"""An execution's message: captured at publish or at delivery, published again as it was.

The sweep, a woken release and an operator's re-drive all send "the same message
again": the same task id (so it is the same execution), the same arguments, and
the same publish options (queue and routing, priority, links and chain, root and
parent ids, time limits, retries, custom headers, ``argsrepr``). What is kept is
JSON text in kombu's encoding, so dates, decimals and UUIDs survive the round trip.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from kombu.utils import json as kombu_json

from celery_agboss.core import sabotage
from celery_agboss.core.executions import ExecutionMessage, ExecutionRecord
from celery_agboss.core.keys import KEY_COLUMN_LENGTH
from celery_agboss.core.log_events import EXECUTION_NOT_RECORDED, log_event
from celery_agboss.core.protections import (
    FIRST_RUN_GETS_UNKEPT_ARGUMENTS,
    REPUBLISH_FORGETS_OWN_RETRIES,
)
from celery_agboss.errors import ConfigurationError, PublishNotRecorded, PublishRefusedError

OWN_RETRIES_HEADER = "agboss_retries"
"""The header counting celery_agboss's own retries of a message (``delivery.waits``): how
many of Celery's ``retries`` were not the application's. Kept on every re-publish, as
``retries`` is, or they would all count against the application's ``max_retries``."""

OWN_RETRIES_REDRIVEN_HEADER = "agboss_retries_redriven"
"""How many of ``OWN_RETRIES_HEADER`` were counted when the message was last re-published:
the package's retry budget counts only those after (a re-publish starts it again)."""

# Headers of Celery's message protocol 2 that are not custom headers.
_PROTOCOL_HEADERS = frozenset(
    {
        "lang",
        "task",
        "id",
        "shadow",
        "eta",
        "expires",
        "group",
        "group_index",
        "retries",
        "timelimit",
        "root_id",
        "parent_id",
        "argsrepr",
        "kwargsrepr",
        "origin",
        "ignore_result",
        "replaced_task_nesting",
        "stamped_headers",
        "stamps",
        "x-death",
    }
)


_kombu_dumps: Callable[[Any], str] = kombu_json.dumps
_kombu_loads: Callable[[str], Any] = kombu_json.loads


def retries_header(headers: Mapping[str, Any] | None, name: str) -> int:
    """A retry count kept in a custom header; 0 when absent or unreadable (a message
    from an older version, or one a person wrote by hand)."""
    try:
        return max(0, int((headers or {}).get(name, 0) or 0))
    except (TypeError, ValueError):
        return 0


def dumps(value: Any) -> str:
    """kombu's JSON: dates, decimals, UUIDs and bytes kept with type markers."""
    return _kombu_dumps(value)


def loads(text: str) -> Any:
    return _kombu_loads(text)


def time_limits(value: Any) -> tuple[Any, Any]:
    """Celery's ``timelimit`` pair ``[hard, soft]`` (either may be missing)."""
    hard, soft, *_ = [*list(value or ()), None, None]
    return hard, soft


def _ms(value: Any) -> int | None:
    """A header time (ISO text or datetime) as epoch ms; None when absent or unreadable."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return int(value.timestamp() * 1000)
    return None


def _drop_none(options: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in options.items() if value not in (None, [], {})}


def _routing(exchange: Any, routing_key: Any) -> dict[str, Any]:
    exchange_name = getattr(exchange, "name", exchange)
    if not exchange_name and routing_key:
        return {"queue": routing_key}
    return {"exchange": exchange_name, "routing_key": routing_key}


def message_from_publish(
    *,
    body: Any,
    exchange: Any,
    routing_key: Any,
    headers: Mapping[str, Any],
    properties: Mapping[str, Any],
) -> ExecutionMessage | None:
    """The message ``before_task_publish`` is about to send (protocol 2 only); None when
    it cannot be read. Raises ``PublishNotRecorded`` for a task id no store can keep, and
    ``ArgumentsNotKeptError`` for arguments the store's JSON cannot keep."""
    task_id = headers.get("id")
    name = headers.get("task")
    if not task_id or not name or not isinstance(body, (tuple, list)) or len(body) != 3:
        return None
    _refuse_an_id_too_long(name, str(task_id))
    args, kwargs, embed = body
    embed = embed or {}
    time_limit, soft_time_limit = time_limits(headers.get("timelimit"))
    custom = {k: v for k, v in headers.items() if k not in _PROTOCOL_HEADERS}
    options = _drop_none(
        {
            **_routing(exchange, routing_key),
            "priority": properties.get("priority"),
            "link": embed.get("callbacks"),
            "link_error": embed.get("errbacks"),
            "chain": embed.get("chain"),
            "chord": embed.get("chord"),
            "root_id": headers.get("root_id"),
            "parent_id": headers.get("parent_id"),
            "group_id": headers.get("group"),
            "group_index": headers.get("group_index"),
            "shadow": headers.get("shadow"),
            "time_limit": time_limit,
            "soft_time_limit": soft_time_limit,
            "retries": headers.get("retries") or None,
            "ignore_result": headers.get("ignore_result") or None,
            "argsrepr": headers.get("argsrepr"),
            "kwargsrepr": headers.get("kwargsrepr"),
            "headers": custom,
        }
    )
    return ExecutionMessage(
        execution_id=str(task_id),
        task_name=str(name),
        args=kept_arguments(list(args or ())),
        kwargs=kept_arguments(dict(kwargs or {})),
        options=dumps(options),
        eta_ms=_ms(headers.get("eta")),
        expires_ms=_ms(headers.get("expires")),
    )


class ArgumentsNotKeptError(ValueError):
    """A PaymentTask's arguments the store cannot keep as JSON."""


def kept_arguments(value: list[Any] | dict[str, Any]) -> str:
    """``value`` as the store keeps it, for every re-publish (a long retry, a take-over, the
    sweep's re-drive) to send again; refused when JSON cannot hold it (a set)."""
    try:
        return dumps(value)
    except (TypeError, ValueError) as exc:
        raise ArgumentsNotKeptError(
            f"its arguments cannot be kept in the store as JSON ({exc}); a re-run is sent "
            "from there, so give a PaymentTask JSON-shaped arguments (lists, dicts, "
            "numbers, strings, dates, decimals)"
        ) from None


def serializer_of(app: Any, task: Any) -> str:
    """The serializer a task's messages go out with: its own, else the app's. (An
    ``apply_async(serializer=...)`` of one call is not seen.)"""
    chosen = getattr(task, "serializer", None) or app.conf.task_serializer
    return str(chosen or "json")


def arguments_as_kept(
    task: Any, record: ExecutionRecord, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments a body runs with: the store's copy, under a serializer other than
    JSON. Every re-run (a long retry, a take-over, the sweep's re-drive) is sent from that
    JSON copy; the first run, given pickle's originals, would see other values (``{101:
    2}`` where re-runs see ``{"101": 2}``), make another request, and its replay be
    refused: the paid execution FAILED, its undo refunding a good charge. So every run
    gets what JSON keeps. Under JSON the message is that copy already."""
    if serializer_of(task.app, task) == "json" or sabotage.active(FIRST_RUN_GETS_UNKEPT_ARGUMENTS):
        return args, kwargs
    return tuple(loads(record.args)), dict(loads(record.kwargs))


def _id_too_long(task_id: str) -> str | None:
    """Why the store cannot keep ``task_id`` as an execution id, or None when it can:
    PostgreSQL refuses a longer row, which reads as a store outage ("again once the store
    answers", for ever); SQLite would keep it, and the same code fail on PostgreSQL."""
    if len(task_id) <= KEY_COLUMN_LENGTH:
        return None
    return (
        f"its task id has {len(task_id)} characters, more than the {KEY_COLUMN_LENGTH} the "
        f"store keeps an execution id in (it starts {task_id[:32]!r})"
    )


def _refuse_an_id_too_long(name: Any, task_id: str) -> None:
    """A task id (a user's ``task_id=``) the store cannot keep: refused at publish on both
    stores, naming the limit; nothing is published."""
    why = _id_too_long(task_id)
    if why is None:
        return
    log_event(
        EXECUTION_NOT_RECORDED,
        logging.ERROR,
        task=name,
        reason=f"task id of {len(task_id)} characters, over {KEY_COLUMN_LENGTH}",
    )
    raise PublishNotRecorded(
        PublishRefusedError(
            f"the publish of {name!r} was refused and nothing was published: {why}. "
            "Publish it under a shorter task_id (a uuid, or a digest of the long "
            "identifier); waiting or retrying will not help",
            task=name,
        )
    )


def message_from_request(task_name: str, request: Any) -> ExecutionMessage:
    """The message a delivery is running, rebuilt from ``task.request``. Raises
    ``ConfigurationError`` for a task id the store cannot keep: only a publisher without
    celery_agboss (which refuses it at publish) sends one, and its delivery must fail
    saying so, not wait for ever on what reads as a store outage."""
    why = _id_too_long(str(request.id))
    if why is not None:
        raise ConfigurationError(
            f"the delivery of {task_name!r} was refused and its body not run: {why}. Its "
            "publisher did not go through celery_agboss, which refuses such an id at "
            "publish; publish it again under a shorter task_id"
        )
    delivery = getattr(request, "delivery_info", None) or {}
    time_limit, soft_time_limit = time_limits(getattr(request, "timelimit", None))
    headers = getattr(request, "headers", None) or {}
    custom = {k: v for k, v in headers.items() if k not in _PROTOCOL_HEADERS}
    options = _drop_none(
        {
            **_routing(delivery.get("exchange"), delivery.get("routing_key")),
            "priority": delivery.get("priority"),
            "link": getattr(request, "callbacks", None),
            "link_error": getattr(request, "errbacks", None),
            "chain": getattr(request, "chain", None),
            "chord": getattr(request, "chord", None),
            "root_id": getattr(request, "root_id", None),
            "parent_id": getattr(request, "parent_id", None),
            "group_id": getattr(request, "group", None),
            "group_index": getattr(request, "group_index", None),
            "shadow": getattr(request, "shadow", None),
            "time_limit": time_limit,
            "soft_time_limit": soft_time_limit,
            "retries": getattr(request, "retries", 0) or None,
            "ignore_result": getattr(request, "ignore_result", False) or None,
            "argsrepr": getattr(request, "argsrepr", None),
            "kwargsrepr": getattr(request, "kwargsrepr", None),
            "headers": custom,
        }
    )
    return ExecutionMessage(
        execution_id=str(request.id),
        task_name=task_name,
        args=dumps(list(getattr(request, "args", None) or ())),
        kwargs=dumps(dict(getattr(request, "kwargs", None) or {})),
        options=dumps(options),
        eta_ms=_ms(getattr(request, "eta", None)),
        expires_ms=_ms(getattr(request, "expires", None)),
    )


def _budget_started_again(headers: Mapping[str, Any]) -> dict[str, Any]:
    """A re-publish starts the package's own retry budget again (the sweep spaced it),
    but the count stays: ``retries`` still holds those retries, and only the header
    tells the application's from the package's."""
    if sabotage.active(REPUBLISH_FORGETS_OWN_RETRIES):
        forgotten = (OWN_RETRIES_HEADER, OWN_RETRIES_REDRIVEN_HEADER)
        return {k: v for k, v in headers.items() if k not in forgotten}
    own = retries_header(headers, OWN_RETRIES_HEADER)
    return {**headers, OWN_RETRIES_HEADER: own, OWN_RETRIES_REDRIVEN_HEADER: own}


def republish(
    app: Any, record: ExecutionRecord | ExecutionMessage, *, not_before_ms: int | None = None
) -> Any:
    """Publish the execution's message again, same id, arguments and options.

    The ETA is the latest of the message's own and ``not_before_ms``; a time in the
    past is simply "now". Returns the ``AsyncResult``.
    """
    message = record.message if isinstance(record, ExecutionRecord) else record
    options: dict[str, Any] = dict(loads(message.options) or {})
    headers = options.get("headers")
    if isinstance(headers, dict) and OWN_RETRIES_HEADER in headers:
        options["headers"] = _budget_started_again(headers)
    args = loads(message.args) or []
    kwargs = loads(message.kwargs) or {}
    eta_candidates = [t for t in (message.eta_ms, not_before_ms) if t is not None]
    eta_ms = max(eta_candidates) if eta_candidates else None
    now_ms = int(datetime.now(timezone.utc).timestamp() * 1000)
    if eta_ms is not None and eta_ms > now_ms:
        options["eta"] = datetime.fromtimestamp(eta_ms / 1000, tz=timezone.utc)
    started = isinstance(record, ExecutionRecord) and record.started_at_ms is not None
    # ``expires`` bounds when an execution may *start*; one that started must finish.
    if message.expires_ms is not None and not started:
        options["expires"] = datetime.fromtimestamp(message.expires_ms / 1000, tz=timezone.utc)
    return app.send_task(
        message.task_name,
        args=args,
        kwargs=kwargs,
        task_id=message.execution_id,
        add_to_parent=False,
        **options,
    )


__all__ = [
    "dumps",
    "loads",
    "message_from_publish",
    "message_from_request",
    "republish",
    "retries_header",
]
