"""Undo once (a saga's compensation), as the engine sees it — no Celery, no SQL.

A step that succeeded (an outbound call, a fenced effect) may declare its undo: the
name of a registered undo function and JSON arguments, or a Celery signature (kept as
its parts: task name, args, kwargs, options, all JSON). The declaration is a
fenced-effect record of the execution, numbered in the order the body declared them
(``<tenant>:t:<execution id>:agboss.undo#n``), so it survives a crash and every
delivery reads the same list. When the execution fails for real, or is cancelled
after a completed payment, the undos run in reverse order, each under its own key,
``<step key>:compensation``:

- each one is marked done by a fenced-effect record under that key, written in a
  fenced transaction once the undo function returned, and an undo whose mark exists
  is never run again, on any worker;
- calls and effects inside an undo default their business key to that key (the n-th
  of one name to ``<undo key>:call#n``), so a refund made there is one intent whatever
  delivery makes it, and two partial refunds are two: an undo that crashed
  after its refund and before its mark replays the refund, it does not send it again
  (design: PS10). Between the refund's effect and the mark, the undo function runs again: only
  what it does through ``outbound()`` or ``fenced_effect()`` is exactly once;
- a mark that compensation started (``agboss.compensating``) keeps the original
  failure, so a delivery after a crash continues the undo, never the body.

A business-keyed step is one step for every execution that names its key: its undo
runs once, by whichever execution undoes it first — covering another only when it
declared every undo that one did for the step (else that one waits for a person).

Every read and write that starts an undo is fenced: a holder superseded mid-body whose
body then raises (a zombie woken after the take-over completed) runs none (design: P5).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.canonical import ensure_json
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.handled_steps import decide_handled_step
from celery_agboss.core.keys import KEY_COLUMN_LENGTH, fit_key, step_key
from celery_agboss.core.lease import LeaseRenewer
from celery_agboss.core.log_events import FENCED_EFFECT_REPLAYED, UNDO_DONE, log_event
from celery_agboss.core.protections import (
    FENCED_HOLDER_STARTS_UNDO,
    ONE_UNDO_PER_STEP,
    UNDO_CALLS_SHARE_ONE_KEY,
    UNDO_INTENTS_FROM_DONE_MARKS_ONLY,
    UNDO_NOT_MARKED_DONE,
    UNDO_PAUSES_SHARE_ONE_NAME,
)
from celery_agboss.core.shared_records import UndoDecision, UndoOutcome
from celery_agboss.core.shared_steps import (
    DeclaredAfter,
    HandledIn,
    UndosOf,
    compensated_if_taken_back,
    decide_step,
    loggable_step,
    not_covered_error,
    step_notes,
)
from celery_agboss.core.store_protocol import (
    EFFECT_RECORD,
    INTENT_RECORD,
    EffectRecord,
    FencedTransaction,
    SharedRecord,
    Store,
    StoreTransaction,
)
from celery_agboss.core.undo_steps import (
    UndoDeclaration,
    check_undo_name,
    compensation_key,
    refuse_in_an_undo_task,
    run_task_undos_with,
    task_undo_runner,
    trail_of,
    undo_call_key,
    undo_registry,
)
from celery_agboss.errors import ConfigurationError, UndoMustWait

UNDO_RECORD = "agboss.undo"
"""The fenced-effect name of an undo declaration (the store finds an execution's by it)."""

DONE_RECORD = "agboss.compensation"
"""The fenced-effect name of an undo's done mark, kept under ``<step key>:compensation``."""

STARTED_RECORD = "agboss.compensating"
"""The fenced-effect name of the mark that an execution's compensation started."""

FAILURE = "failure"
CANCEL = "cancel"
"""Why compensation started: the body failed for real, or a cancel came after a payment."""

TASK_PARTS = ("task", "args", "kwargs", "options")
"""What an undo declared as a Celery signature keeps of it (``UndoDeclaration.task``)."""


def declaration_key(settings: EngineSettings, execution_id: str, position: int) -> str:
    """Fitted to the key column (an execution id may be as long as the column itself)."""
    raw = step_key(settings.tenant, execution_id, UNDO_RECORD, position)
    return fit_key(raw, KEY_COLUMN_LENGTH)


def started_key(settings: EngineSettings, execution_id: str) -> str:
    return fit_key(step_key(settings.tenant, execution_id, STARTED_RECORD, 1), KEY_COLUMN_LENGTH)


@dataclass(frozen=True)
class UndoStep:
    """What an undo function is given besides its arguments."""

    name: str  # the registered undo function's name
    step_key: str  # the step it undoes
    key: str  # ``<step key>:compensation``: the default business key of its calls
    arguments: Mapping[str, Any]
    execution_id: str
    cause: str  # FAILURE or CANCEL
    task: Mapping[str, Any] | None = None  # declared as a Celery signature: its parts
    position: int = 0  # its declaration's (an undo's task names it: UNDO_POSITION_HEADER)

    def pause_name(self, name: str) -> str:
        """A pause this undo makes is its own (``name@<12 hex of its key>``): two undos of
        one function asking ``approve-refund`` for two payments get two answers."""
        if sabotage.active(UNDO_PAUSES_SHARE_ONE_NAME):
            return name
        return f"{name}@{hashlib.sha256(self.key.encode()).hexdigest()[:12]}"

    def pause_id(self, name: str) -> str:
        """The id ``answer_pause`` takes for this undo's pause ``name``."""
        return f"{self.execution_id}:{self.pause_name(name)}"


@dataclass(frozen=True)
class CompensationStarted:
    """The mark that compensation started, with what the execution ends with after it."""

    cause: str
    reason: str
    error: str | None  # the failure, encoded by the layer above (FAILURE only)
    # The intents the execution had used when it started (its body's: the body never runs
    # after it); None in a mark written before they were kept (``intents_made_by_undos``).
    body: frozenset[str] | None = None


# --- declarations ------------------------------------------------------------------------


def read_declarations(
    tx: StoreTransaction, settings: EngineSettings, execution_id: str
) -> list[UndoDeclaration]:
    """Every undo the execution declared, in the order it declared them."""
    found: list[UndoDeclaration] = []
    position = 1
    while True:
        record = tx.read_effect(declaration_key(settings, execution_id, position))
        if record is None or not isinstance(record.result, dict):
            return found
        found.append(declaration_of(position, record.result))
        position += 1


def declaration_of(position: int, value: Mapping[str, Any]) -> UndoDeclaration:
    """A declaration as its record stores it (``declare_undo`` writes it)."""
    task, kind = value.get("task"), value.get("kind")
    return UndoDeclaration(
        position=position,
        step_key=str(value["step"]),
        undo=str(value["undo"]),
        arguments=dict(value.get("arguments") or {}),
        task=dict(task) if isinstance(task, dict) else None,
        n=int(value.get("n") or 1),
        kind=str(kind) if kind in (INTENT_RECORD, EFFECT_RECORD) else None,
        moves_money=value.get("moves_money") is not False,  # absent: a payment (safe)
    )


def declare_undo(
    ctx: ExecutionContext,
    undo: str,
    arguments: Mapping[str, Any],
    *,
    task: Mapping[str, Any] | None = None,
) -> UndoDeclaration:
    """Declare the undo of the step this delivery completed last. Several after one step
    are all kept, numbered in the order the body declares them (and run in reverse); a
    re-run that declares them again finds each one where it was. Not refused by a cancel
    request: declaring moves no money, and the cancel needs the undo. ``task``: the
    parts of a Celery signature (``TASK_PARTS``, ``undo`` its task name), run by
    ``task_undo_runner()``."""
    check_undo_name(undo)
    # Its record is written in a fenced transaction of its own: never inside an effect's.
    ctx._refuse_inside_an_effect("undo_with()")
    parts = None if task is None else _task_parts(undo, task, arguments)
    if isinstance(ctx, UndoContext):
        raise ConfigurationError("an undo cannot declare an undo of its own", undo=undo)
    trail = trail_of(ctx)
    refuse_in_an_undo_task(trail, undo)
    last = ctx.last_step
    if last is None:
        raise ConfigurationError(
            "undo_with() declares the undo of the step that just returned: call it right "
            "after the outbound() or fenced_effect() it undoes",
            undo=undo,
        )
    step = last.key
    values = dict(arguments)
    try:
        ensure_json(values if parts is None else parts)
    except TypeError as exc:
        raise ConfigurationError(f"the arguments of undo {undo!r} must be JSON: {exc}") from None
    n = 1 if sabotage.active(ONE_UNDO_PER_STEP) else trail.step_undos.get(step, 0) + 1
    trail.step_undos[step] = n
    with ctx.fenced() as tx:
        known = read_declarations(tx, ctx.settings, ctx.execution_id)
        for declaration in known:
            if declaration.step_key == step and declaration.n == n:
                trail.declared = max(trail.declared, len(known))
                return declaration
        kind, money = last.kind, ctx.step_moves_money(last)
        declaration = UndoDeclaration(len(known) + 1, step, undo, values, parts, n, kind, money)
        stored: dict[str, Any] = {"step": step, "undo": undo, "arguments": values, "n": n}
        stored.update(kind=kind, **({} if money else {"moves_money": False}))  # absent: True
        if parts is not None:
            stored["task"] = parts
        tx.insert_effect(
            EffectRecord(
                key=declaration_key(ctx.settings, ctx.execution_id, declaration.position),
                execution_id=ctx.execution_id,
                name=UNDO_RECORD,
                result=stored,
                token=ctx.lease_ref.token,
                created_at_ms=tx.now_ms,
            )
        )
    trail.declared = declaration.position
    return declaration


def _task_parts(undo: str, task: Mapping[str, Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    if arguments:
        raise ConfigurationError(f"undo {undo!r} is a signature: it carries its own arguments")
    parts = {name: task.get(name) for name in TASK_PARTS}
    kinds = (str, list, dict, dict)
    if parts["task"] != undo or not all(map(isinstance, parts.values(), kinds)):
        raise ConfigurationError(f"undo {undo!r}: a signature's parts are {TASK_PARTS}")
    return parts


# --- the start mark ----------------------------------------------------------------------


def mark_started_in(
    tx: FencedTransaction,
    settings: EngineSettings,
    execution_id: str,
    started: CompensationStarted,
) -> None:
    """Record that compensation started (once: a later start keeps the first mark)."""
    key = started_key(settings, execution_id)
    if tx.read_effect(key) is not None:
        return
    body = sorted(record.key for record in tx.shared_records_of(execution_id))
    tx.insert_effect(
        EffectRecord(
            key=key,
            execution_id=execution_id,
            name=STARTED_RECORD,
            result={
                "cause": started.cause,
                "reason": started.reason,
                "error": started.error,
                "body": body,
            },
            token=tx.lease.token,
            created_at_ms=tx.now_ms,
        )
    )


def read_started(
    store: Store, settings: EngineSettings, execution_id: str
) -> CompensationStarted | None:
    record = store.read_effect(started_key(settings, execution_id))
    return None if record is None else started_of(record.result)


def started_of(value: Any) -> CompensationStarted | None:
    """The start mark as its record stores it (``mark_started_in`` writes it)."""
    if not isinstance(value, dict):
        return None
    error, body = value.get("error"), value.get("body")
    return CompensationStarted(
        cause=str(value.get("cause") or FAILURE),
        reason=str(value.get("reason") or ""),
        error=None if error is None else str(error),
        body=frozenset(map(str, body)) if isinstance(body, list) else None,
    )


# --- running them -------------------------------------------------------------------------


class UndoContext(ExecutionContext):
    """The context undos run in: the delivery's own lease, no cancel check (an undo that
    started runs to its end), and the running undo's key as the default business key of
    its calls and effects (the n-th of one name: ``undo_call_key``), so that each refund
    has one key on every delivery."""

    current: UndoStep | None = None
    decisions: dict[str, UndoDecision]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decisions = {}  # per step: what this execution does with it (decide_step)

    @classmethod
    def over(cls, ctx: ExecutionContext, renewer: LeaseRenewer | None = None) -> UndoContext:
        """A context on ``ctx``'s lease (``ctx`` is not used after this)."""
        return cls(ctx.store, ctx.lease, ctx.execution_id, ctx.settings, renewer=renewer)

    def business_key_for(self, given: str | None) -> str | None:
        """The business key as the undo's code gave it (kept as it is); one given none is
        keyed as its step is opened (``default_business_key``). Outside an undo, a call
        without one is refused."""
        if given is None:
            self._running_undo()
        return given

    def default_business_key(self, kind: str, name: str) -> str:
        """A call or effect the running undo makes without a business key: keyed by the
        undo's key and its position among the undo's steps of this name, counted here, in
        ``_open_step``, as every step is (``core.step_identity``). The first keeps the
        undo's key (a refund in flight keeps its key); the n-th gets one of its own, the
        same on every delivery of the undo (``undo_call_key``)."""
        undo = self._running_undo()
        if sabotage.active(UNDO_CALLS_SHARE_ONE_KEY):
            return undo.key
        return undo_call_key(undo.key, self._next(f"{kind} in {undo.key}", name))

    def pause_name(self, name: str) -> str:
        return name if self.current is None else self.current.pause_name(name)

    def _running_undo(self) -> UndoStep:
        if self.current is None:
            raise ConfigurationError(
                "outbound() and fenced_effect() run here only inside an undo",
                execution_id=self.execution_id,
            )
        return self.current


def run_undos(
    ctx: UndoContext,
    declarations: Iterable[UndoDeclaration],
    call: Callable[[UndoStep], Any],
    *,
    cause: str,
    handled: Collection[str] = (),
    handled_in: HandledIn | None = None,
) -> int:
    """Run every undo not marked done, last declared first, each marked done in a fenced
    write once ``call`` returned; the number run. Each step is first decided as a shared
    record (``decide_step``: kept, covered, waited for, or claimed and undone); a claim
    that skips its undos waits for a person once the others ran. The step reads
    compensated once its every undo finished. What ``call`` raises propagates (the next
    delivery runs it). ``handled``: payment steps an operator settled by hand, claimed,
    never run nor marked (``core.handled_steps``); ``handled_in``: another's were."""
    wanted, ran, undos = list(declarations), 0, undos_of(ctx.settings, handled_in)
    for declaration in sorted(wanted, key=lambda d: d.position, reverse=True):
        decision = ctx.decisions.get(declaration.step_key)
        if decision is None:
            decide = decide_handled_step if declaration.step_key in handled else decide_step
            decision = ctx.decisions[declaration.step_key] = decide(ctx, declaration, undos)
        if decision.outcome is UndoOutcome.WAIT:
            assert decision.other is not None
            raise UndoMustWait(decision.other, declaration.step_key)
        if decision.outcome is not UndoOutcome.UNDO or declaration.step_key in handled:
            continue
        step = UndoStep(
            name=declaration.undo,
            step_key=declaration.step_key,
            key=declaration.key,
            arguments=declaration.arguments,
            execution_id=ctx.execution_id,
            cause=cause,
            task=declaration.task,
            position=declaration.position,
        )
        log_ref: dict[str, Any] = {"execution_id": ctx.execution_id, "undo": step.name}
        if _done(ctx, step):
            log_event(FENCED_EFFECT_REPLAYED, effect=DONE_RECORD, **log_ref)
            with ctx.fenced() as tx:  # a crash may have come between its mark and the step's
                compensated_if_taken_back(tx, ctx.execution_id, declaration, wanted, undos)
            continue
        ctx.current = step
        before = ctx.reached_keys()
        try:
            call(step)
        finally:
            ctx.current = None
        if not sabotage.active(UNDO_NOT_MARKED_DONE):
            with ctx.fenced() as tx:
                tx.insert_effect(
                    EffectRecord(
                        key=step.key,
                        execution_id=ctx.execution_id,
                        name=DONE_RECORD,
                        result={
                            "undo": step.name,
                            "step": step.step_key,
                            "intents": sorted(ctx.reached_keys() - before),
                        },
                        token=ctx.lease_ref.token,
                        created_at_ms=tx.now_ms,
                    )
                )
                compensated_if_taken_back(tx, ctx.execution_id, declaration, wanted, undos)
        log_event(UNDO_DONE, **log_ref, **loggable_step(ctx.settings, step.step_key))
        ran += 1
    skipped = {k: d for k, d in ctx.decisions.items() if d.outcome is UndoOutcome.NOT_COVERED}
    skipped = {k: d for k, d in skipped.items() if k not in handled}  # a person decided
    if skipped:  # after every other undo ran: a person decides on these alone
        raise not_covered_error(ctx.settings, ctx.execution_id, skipped)
    return ran


def undos_of(settings: EngineSettings, handled: HandledIn | None = None) -> UndosOf:
    """What an execution declared after a step: whether one's claim covers another's."""
    return DeclaredAfter(lambda tx, e: read_declarations(tx, settings, e), handled)


def _done(ctx: UndoContext, step: UndoStep) -> bool:
    """Whether the undo's done mark exists (read under the lease). Only this execution
    writes the marks of the steps it claimed."""
    if sabotage.active(UNDO_NOT_MARKED_DONE):
        return False
    if sabotage.active(FENCED_HOLDER_STARTS_UNDO):
        return ctx.store.read_effect(step.key) is not None
    with ctx.fenced() as tx:
        mark = tx.read_effect(step.key)
    return mark is not None


def intents_made_by_undos(
    tx: StoreTransaction,
    declarations: Iterable[UndoDeclaration],
    started: CompensationStarted | None = None,
    records: Iterable[SharedRecord] = (),
) -> set[str]:
    """The intents the execution's undos made (their refunds): the undo itself, not a
    payment a cancel, or the "failed after a payment" listing, must account for. Each
    done mark names those its own run reached; an undo re-run after a crash that finds
    its refund made (it read the gateway first) reaches none, so every record of the
    execution (``records``) that is not among its body's, kept in the start mark, is
    an undo's too: the body never runs after that mark."""
    made: set[str] = set()
    for declaration in declarations:
        mark = tx.read_effect(declaration.key)
        if mark is not None and isinstance(mark.result, dict):
            made.update(str(key) for key in mark.result.get("intents") or ())
    body = None if started is None else started.body
    if body is not None and not sabotage.active(UNDO_INTENTS_FROM_DONE_MARKS_ONLY):
        made.update(record.key for record in records if record.key not in body)
    return made


__all__ = [
    "CANCEL",
    "DONE_RECORD",
    "FAILURE",
    "STARTED_RECORD",
    "TASK_PARTS",
    "UNDO_RECORD",
    "CompensationStarted",
    "UndoContext",
    "UndoDeclaration",
    "UndoStep",
    "compensation_key",
    "decide_step",
    "declare_undo",
    "intents_made_by_undos",
    "mark_started_in",
    "read_declarations",
    "read_started",
    "run_task_undos_with",
    "run_undos",
    "started_of",
    "step_notes",
    "task_undo_runner",
    "trail_of",
    "undo_registry",
    "undos_of",
]
