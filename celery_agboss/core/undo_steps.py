"""What undo declarations refer to: the declarations a delivery made, and the
registered undo functions (``celery_agboss.core.compensation`` runs them).

``undo_with()`` declares the undo of the step that returned last, as the delivery's
``ExecutionContext`` names it (``last_step``: the one home of a step's key). Undo
functions are registered by name, per application, so that a declaration stored by one
worker finds the same function on every other. An
undo declared as a Celery signature has one runner for every app: publishing goes
through the outbox, a layer above the core, so ``celery_agboss.task`` installs it.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from celery_agboss.core import sabotage
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.execution_states import Verdict
from celery_agboss.core.executions import ExecutionState
from celery_agboss.core.keys import KEY_COLUMN_LENGTH, fit_key
from celery_agboss.core.protections import (
    UNDO_TASK_CANCEL_ENDS_CANCELLED,
    UNDO_TASK_READ_UNDONE_ON_PUBLISH,
)
from celery_agboss.core.store_protocol import StoreTransaction
from celery_agboss.errors import ConfigurationError

Owner = TypeVar("Owner")
V = TypeVar("V")

UNDO_OF_HEADER = "agboss_undo_of"
"""The custom header of an undo's task (one declared as a signature): the execution whose
step it undoes. That execution's undo counts as run once the task is published (it ends
``FAILED`` or ``CANCELLED``), so the task's failure waits for a person instead of ending
``FAILED`` (``delivery.compensating``): nobody else would make the refund."""

UNDO_POSITION_HEADER = "agboss_undo_position"
"""Beside ``UNDO_OF_HEADER``: the position of the declaration the task runs, among its
parent's. The task's ``COMPLETED`` marks that undo finished (``undo_task_done_key``), and
only then does the step read undone for the record (``steps_undone(refunded=True)``)."""

UNDO_TASK_DONE_SUFFIX = ":task-done"
UNDO_TASK_DONE_RECORD = "agboss.undo-task-done"
"""The fenced-effect name of that mark, kept under ``undo_task_done_key``."""

UNDO_TASK_CANCELLED = "undo task cancelled"
"""The reason's start of an undo's task whose cancel (a revoke) came before its refund: it
waits for an operator (``redrive`` runs it; ``cancel --payments-handled`` after a refund
by hand), as a failed one does, since its parent counts its undo as run."""


UNDO_TASK_REDRIVEN = "redriven by an operator after its cancel"
"""The cancel reason ``redrive`` leaves on an undo's task whose cancel it cleared: a
worker that still holds its id or stamp revoked delivers it then, without recording that
revoke again (a revoke it has not recorded yet, by a stamp, it records)."""


def revoke_already_handled(cancel_requested: bool, cancel_reason: str | None) -> bool:
    """An undo's task whose cancel an operator cleared to run it (``UNDO_TASK_REDRIVEN``)."""
    return not cancel_requested and cancel_reason == UNDO_TASK_REDRIVEN


def _options_header(options: str | None, name: str) -> object:
    """A custom header of a stored message's options (their ``headers``), or None."""
    try:
        headers = json.loads(options or "{}").get("headers")
    except (ValueError, AttributeError):
        return None
    return headers.get(name) if isinstance(headers, dict) else None


def undo_of_options(options: str | None) -> str | None:
    """The execution an undo's task undoes a step of, read from its stored message options
    (their ``headers``: ``UNDO_OF_HEADER``); None for any other task."""
    found = _options_header(options, UNDO_OF_HEADER)
    return str(found) if found else None


def undo_position_options(options: str | None) -> int | None:
    """The position of the declaration an undo's task runs (``UNDO_POSITION_HEADER``), read
    from its stored message options; None for any other task, or one published before the
    header was sent."""
    found = str(_options_header(options, UNDO_POSITION_HEADER) or "")
    return int(found) if found.isdigit() else None


def undo_task_cancel_verdict(verdict: Verdict, options: str | None) -> Verdict:
    """A cancel's end as an undo's task sees it: ``CANCELLED`` would leave its parent ended
    with its undo counted as run and the refund never made, seen by nobody, so it waits for
    an operator instead (design: undo once)."""
    parent = undo_of_options(options)
    if (
        verdict.state is not ExecutionState.CANCELLED
        or parent is None
        or sabotage.active(UNDO_TASK_CANCEL_ENDS_CANCELLED)
    ):
        return verdict
    return Verdict(
        ExecutionState.WAITING_OPERATOR,
        f"{UNDO_TASK_CANCELLED} ({verdict.reason}): it undoes a step of execution {parent}, "
        "which counts its undo as run, and its refund was not made; `redrive` runs it, or "
        "refund by hand and `cancel --payments-handled`",
    )


COMPENSATION_SUFFIX = ":compensation"
COMPENSATION_KEY_LIMIT = 200
"""A longer ``<step key>:compensation`` becomes its digest (``fit_key``): it is also the
business key of the calls inside the undo, and their intent keys must fit the store."""


def compensation_key(step: str, n: int = 1) -> str:
    """``<step key>:compensation`` (``…:compensation#n`` for the n-th undo declared after
    one step): the key an undo runs under (its done mark's key, and the default business
    key of the calls it makes)."""
    suffix = COMPENSATION_SUFFIX if n == 1 else f"{COMPENSATION_SUFFIX}#{n}"
    return fit_key(step + suffix, COMPENSATION_KEY_LIMIT)


def undo_task_done_key(undo_key: str) -> str:
    """The key of the mark an undo's task writes with its ``COMPLETED``: its refund made,
    not only published (``<undo key>:task-done``)."""
    return fit_key(undo_key + UNDO_TASK_DONE_SUFFIX, KEY_COLUMN_LENGTH)


UNDO_CALL_SUFFIX = ":call#"
"""After an undo's key, the position of a call: ``:compensation#n`` already names the n-th
undo declared after one step, whose calls default to that key."""


def undo_call_key(undo_key: str, n: int) -> str:
    """The default business key of the n-th call (or effect) of one name inside the undo
    keyed ``undo_key``: that key itself for the first, so a refund already made or in
    flight keeps its key; ``<undo key>:call#n`` after it, one key per position, the same
    on every delivery, and never another undo's (``compensation_key``)."""
    if n == 1:
        return undo_key
    return fit_key(f"{undo_key}{UNDO_CALL_SUFFIX}{n}", COMPENSATION_KEY_LIMIT)


@dataclass(frozen=True)
class UndoDeclaration:
    """The undo one step declared, as stored: what runs, with what, in which order."""

    position: int
    step_key: str
    undo: str  # the undo function's name, or the signature's task name
    arguments: dict[str, Any]
    task: dict[str, Any] | None = None  # a signature's parts (TASK_PARTS), or None
    n: int = 1  # the n-th undo declared after this step (all are kept, and all run)
    kind: str | None = None  # the step's record: an intent or a fenced effect (None: unknown)
    moves_money: bool = True  # False: its call said it moves none (OutboundCall.moves_money)

    @property
    def key(self) -> str:
        return compensation_key(self.step_key, self.n)


UndoFunction = Callable[..., Any]
"""``fn(task, undo: UndoStep, **arguments)``: ``task`` is what the body calls verbs on."""


# --- registered undo functions -------------------------------------------------------


class UndoRegistry:
    """Undo functions by name, for one application (a Celery app, say)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._functions: dict[str, UndoFunction] = {}

    def register(self, name: str, fn: UndoFunction) -> UndoFunction:
        check_undo_name(name)
        if not callable(fn):
            raise ConfigurationError(f"the undo {name!r} must be a function, not {fn!r}")
        with self._lock:
            known = self._functions.setdefault(name, fn)
        if known is not fn:
            raise ConfigurationError(
                f"another undo function is already registered as {name!r}: an undo declared "
                "by a running execution must always find the same function",
                undo=name,
            )
        return fn

    def get(self, name: str) -> UndoFunction | None:
        with self._lock:
            return self._functions.get(name)

    def require(self, name: str) -> UndoFunction:
        fn = self.get(name)
        if fn is None:
            raise ConfigurationError(
                f"no undo function is registered as {name!r} in this process: import the "
                "module that registers it in every worker",
                undo=name,
            )
        return fn


class _PerOwner(Generic[Owner, V]):
    """One ``V`` per owner, made on first use, gone with its owner (held weakly)."""

    def __init__(self, make: Callable[[], V]) -> None:
        self._make = make
        self._made: weakref.WeakKeyDictionary[Owner, V] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def of(self, owner: Owner) -> V:
        with self._lock:
            made = self._made.get(owner)
            if made is None:
                made = self._made[owner] = self._make()
            return made


_registries: _PerOwner[Any, UndoRegistry] = _PerOwner(UndoRegistry)


def undo_registry(owner: Any) -> UndoRegistry:
    """The registry of ``owner`` (an app): each app has its own, made on first use."""
    return _registries.of(owner)


_task_undo_runner: list[UndoFunction] = []


def run_task_undos_with(runner: UndoFunction) -> None:
    """Install ``runner(task, undo)``, which runs every undo declared as a Celery signature
    (``celery_agboss.task`` does, on import: every worker imports it)."""
    _task_undo_runner[:] = [runner]


def task_undo_runner() -> UndoFunction:
    if not _task_undo_runner:
        raise ConfigurationError(
            "an undo declared as a Celery signature runs through celery_agboss.task: "
            "import it in this process"
        )
    return _task_undo_runner[0]


def check_undo_name(name: Any) -> None:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ConfigurationError(f"an undo needs a name of 1 to 200 characters, not {name!r}")


# --- what the body declared ---------------------------------------------------------


@dataclass
class StepTrail:
    """One delivery's undo declarations (the step each belongs to: ``ctx.last_step``)."""

    step_undos: dict[str, int] = field(default_factory=dict)  # undo_with() calls per step
    declared: int = 0  # declarations this delivery wrote or found
    earlier_deliveries: bool = False  # another delivery may have declared undos
    undo_of: str | None = None  # an undo's task: the execution whose step it undoes


def refuse_in_an_undo_task(trail: StepTrail, undo: str) -> None:
    """``undo_with()`` inside an undo's task: refused at the call. Its own failure waits for
    an operator (its parent counts its undo as run) and never runs undos, so what it declared
    would never run (design: undo once)."""
    if trail.undo_of is not None:
        raise ConfigurationError(
            f"undo_with() inside an undo's task is refused: this task undoes a step of "
            f"execution {trail.undo_of}, and its failure waits for an operator without "
            "running undos of its own. Make each call it makes exactly once instead "
            "(outbound() with a business key: a redrive then finishes it), or declare "
            "another undo after the parent's step (all undos declared after one step run, "
            "last declared first)",
            undo=undo,
            undo_of=trail.undo_of,
        )


_trails: _PerOwner[ExecutionContext, StepTrail] = _PerOwner(StepTrail)


def trail_of(ctx: ExecutionContext) -> StepTrail:
    return _trails.of(ctx)


def undo_finished(tx: StoreTransaction, declaration: UndoDeclaration, *, refunded: bool) -> bool:
    """The undo ran: its done mark exists (only the claimer writes it). ``refunded``: its
    step was taken back, as the record's readers ask (a later click: "is the charge still
    standing?"). An undo declared as a signature is then finished only once its task
    completed (its mark, written with its ``COMPLETED``), not once it was published: queued,
    or declined and waiting for a person, the charge still stands (design: compensated step)."""
    on_publish = sabotage.active(UNDO_TASK_READ_UNDONE_ON_PUBLISH)
    if declaration.task is None or not refunded or on_publish:
        return tx.read_effect(declaration.key) is not None
    return tx.read_effect(undo_task_done_key(declaration.key)) is not None


def steps_undone(
    tx: StoreTransaction, declarations: Iterable[UndoDeclaration], *, refunded: bool = False
) -> set[str]:
    """The steps whose every undo among ``declarations`` is finished (``undo_finished``):
    by default, what an execution that claimed them ran (its own undos are over: a cancel
    or a listing of it has nothing left to run or to name); with ``refunded``, what is
    taken back, so the step's record reads compensated (only the claimer's count)."""
    by_step: dict[str, list[UndoDeclaration]] = {}
    for declaration in declarations:
        by_step.setdefault(declaration.step_key, []).append(declaration)
    return {
        step
        for step, declared in by_step.items()
        if all(undo_finished(tx, d, refunded=refunded) for d in declared)
    }


__all__ = [
    "UNDO_OF_HEADER",
    "UNDO_POSITION_HEADER",
    "UNDO_TASK_CANCELLED",
    "UNDO_TASK_DONE_RECORD",
    "UNDO_TASK_REDRIVEN",
    "StepTrail",
    "UndoDeclaration",
    "UndoFunction",
    "UndoRegistry",
    "check_undo_name",
    "compensation_key",
    "refuse_in_an_undo_task",
    "revoke_already_handled",
    "run_task_undos_with",
    "steps_undone",
    "task_undo_runner",
    "trail_of",
    "undo_call_key",
    "undo_finished",
    "undo_registry",
    "undo_task_cancel_verdict",
    "undo_task_done_key",
]
