"""The ids of an execution's links, fixed before its first publish.

(design: publishes from a body, terminal replays)

Celery sends an execution's callbacks, errbacks and the rest of its chain from every
delivery that completes (or fails) it and did not record that they went out: a duplicate
that replays it, a redelivery after a send that raised. A task in a link that has no id
gets a new one on each send, and a ``PaymentTask`` sent under two ids charges twice. So
every task of a link gets an id derived from the execution and its place in the link,
down through groups, chains and chords: Celery keeps an id a signature already has
(``Signature.freeze``), so every send of the link sends the same executions.

A link's own ``link``/``link_error`` options are fixed too: a plain task in a link runs
again when the link is sent again, and sends its links again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.protections import CANVAS_LINK_MEMBERS_UNFIXED
from celery_agboss.signals.body_publishes import derived_task_id

LINK_PARTS = ("callbacks", "errbacks", "chain")
"""The parts of a message's embed that Celery sends after the task: links."""

_LINK_OPTIONS = ("link", "link_error")

Derive = Callable[[str], str]


def fix_link_ids(body: Any, execution_id: str) -> None:
    """Give every task in the links of the message ``body`` an id derived from
    ``execution_id`` (an id already given stays). The signatures are replaced by
    copies, never changed: the caller's may be reused."""
    if not isinstance(body, (tuple, list)) or len(body) != 3 or not isinstance(body[2], dict):
        return
    embed = body[2]

    def derive(position: str) -> str:
        return derived_task_id(execution_id, position)

    for part in LINK_PARTS:
        signatures = embed.get(part)
        if not signatures:
            continue
        embed[part] = [fixed(sig, f"{part}#{n}", derive) for n, sig in enumerate(signatures, 1)]


def fixed(signature: Any, position: str, derive: Derive, task_id: str | None = None) -> Any:
    """A copy of ``signature`` with an id on itself and on every task in it: the one it
    has, else ``task_id``, else the id derived from ``position``."""
    if not isinstance(signature, dict):
        return signature
    copy = dict(signature)
    options = copy["options"] = dict(signature.get("options") or {})
    options.setdefault("task_id", task_id or derive(position))
    if sabotage.active(CANVAS_LINK_MEMBERS_UNFIXED):
        return copy  # the old way: only the link's own id (a group's, a chain's last task)
    kind = signature.get("subtask_type")
    if kind in ("group", "chain"):
        copy["kwargs"] = _members_fixed(copy, kind, position, derive)
    elif kind == "chord":
        copy["kwargs"] = _chord_fixed(copy, position, derive)
    for name in _LINK_OPTIONS:
        links = options.get(name)
        if isinstance(links, (list, tuple)):
            options[name] = [
                fixed(s, f"{position}/{name}#{n}", derive) for n, s in enumerate(links, 1)
            ]
        elif isinstance(links, dict):
            options[name] = fixed(links, f"{position}/{name}#1", derive)
    return copy


def _members_fixed(canvas: dict[str, Any], kind: str, position: str, derive: Derive) -> Any:
    """A group's or chain's kwargs with every task in it fixed. A chain's own id is its
    last task's (Celery's ``chain(task_id=...)``), kept so for a message recorded before
    the members were fixed."""
    kwargs = dict(canvas.get("kwargs") or {})
    tasks = list(kwargs.get("tasks") or ())
    last = len(tasks) - 1
    chain_id = canvas["options"]["task_id"] if kind == "chain" else None
    kwargs["tasks"] = [
        fixed(task, f"{position}/{n}", derive, chain_id if n == last else None)
        for n, task in enumerate(tasks)
    ]
    return kwargs


def _chord_fixed(chord: dict[str, Any], position: str, derive: Derive) -> Any:
    """A chord's kwargs with its header (the group, every task) and its body fixed. The
    chord's own id names a header given as a list (Celery makes the group under it)."""
    kwargs = dict(chord.get("kwargs") or {})
    header = kwargs.get("header")
    group_id = chord["options"]["task_id"]
    if isinstance(header, dict):
        kwargs["header"] = fixed(header, f"{position}/header", derive, group_id)
    elif isinstance(header, (list, tuple)):
        kwargs["header"] = [
            fixed(task, f"{position}/header/{n}", derive) for n, task in enumerate(header)
        ]
    if kwargs.get("body") is not None:
        kwargs["body"] = fixed(kwargs["body"], f"{position}/body", derive)
    return kwargs


__all__ = ["fix_link_ids"]
