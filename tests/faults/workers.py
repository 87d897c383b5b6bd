"""Code that runs in spawned processes for the store's multi-process tests.

A spawned child imports this module by name, so it lives outside the test files
(which pytest imports by path) and imports nothing from pytest. The last section is the
parent's: reading what the children report, and stopping them. Every child opens its
own ``SQLAlchemyStore`` on the URL it is given, waits on a shared barrier so that
all children hit the database at the same instant, and reports through a queue.
"""

from __future__ import annotations

import contextlib
import os
import queue
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

from celery_agboss.core.sabotage import SUBPROCESS_SWITCH
from celery_agboss.core.store_protocol import EffectRecord, NewIntent

BARRIER_SECONDS = 60.0

GrantRow = tuple[str, int, str, "int | None", "str | None"]


def _open_store(url: str, offset_ms: Any) -> Any:
    from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

    return SQLAlchemyStore(url, clock_offset_source=lambda: int(offset_ms.value))


def acquire_rounds(
    url: str,
    scope: str,
    ttl_ms: int,
    rounds: int,
    offset_ms: Any,
    barrier: Barrier,
    results: Queue[GrantRow],
) -> None:
    """Contend for ``scope`` in ``rounds`` rounds. Each round starts and ends on
    ``barrier``, whose last party is the parent: it checks the round and then moves
    the database clock or releases the lease before the next one starts.

    Reports ``("grant", round, holder, token or None, None)`` per round, or an error row.
    """
    store = None
    try:
        store = _open_store(url, offset_ms)
        store.now_ms()  # connect before the race, not during it
        for number in range(rounds):
            holder = uuid.uuid4().hex  # one per delivery
            barrier.wait(BARRIER_SECONDS)
            grant = store.acquire_lease(scope, holder, ttl_ms)
            token = None if grant is None else grant.lease.token
            results.put(("grant", number, holder, token, None))
            barrier.wait(BARRIER_SECONDS)
    except BaseException:
        results.put(("error", -1, "", None, traceback.format_exc()))
        barrier.abort()  # the others, and the parent, stop waiting for this one
    finally:
        if store is not None:
            store.close()


def insert_keys(
    url: str,
    scope: str,
    keys: Sequence[str],
    ttl_ms: int,
    offset_ms: Any,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """Under a lease of its own, insert an intent and an effect under each of ``keys``,
    one key per round, the instant ``barrier`` opens; report whether this process won
    and what it read back in the same transaction."""
    store = None
    try:
        store = _open_store(url, offset_ms)
        grant = store.acquire_lease(scope, uuid.uuid4().hex, ttl_ms)
        if grant is None:
            raise RuntimeError(f"could not acquire {scope}")
        lease = grant.lease
        for key in keys:
            intent = NewIntent(
                idempotency_key=key,
                execution_id=scope,
                name="race.charge",
                business_key_handle=None,
                fingerprint=scope,
                request={"by": scope},
                owner=lease,
            )
            effect = EffectRecord(key, scope, "race.effect", {"by": scope}, lease.token, 0)
            barrier.wait(BARRIER_SECONDS)
            with store.fenced(lease, ttl_ms) as tx:
                intent_won = tx.insert_intent(intent)
                row = tx.read_intent(key)
                effect_won = tx.insert_effect(effect)
                stored = tx.read_effect(key)
            results.put(
                {
                    "key": key,
                    "racer": scope,
                    "intent_won": intent_won,
                    "intent_seen": None if row is None else row.fingerprint,
                    "effect_won": effect_won,
                    "effect_seen": None if stored is None else stored.result,
                    "error": None,
                }
            )
    except BaseException as exc:
        barrier.abort()
        results.put(
            {
                "racer": scope,
                "error": f"{type(exc).__module__}.{type(exc).__name__}: {exc}\n"
                f"{traceback.format_exc()}",
            }
        )
    finally:
        if store is not None:
            store.close()


# --- an undo and a replay of one shared record ------------------------------------------

SHARED_CALL = "race.charge"
SHARED_REQUEST = {"amount": 1000, "order": "shared"}


def shared_settings(pseudonym_key: bytes, send: Any = None) -> Any:
    """The engine settings both sides of a shared-record race run with: one call, which
    is only ever replayed there (its send, unless given, and its lookup must not be
    reached)."""
    from datetime import timedelta

    from celery_agboss.core.engine_settings import EngineSettings
    from celery_agboss.core.outbound import OutboundCall, Unknown

    def refuse(call: Any) -> Any:
        raise AssertionError("the shared record is replayed, never sent again")

    settings = EngineSettings(
        pseudonym_key=pseudonym_key, lease_ttl_ms=30_000, attempt_timeout_ms=5_000
    )
    settings.register(
        OutboundCall(
            name=SHARED_CALL,
            send=send or refuse,
            reconcile=lambda call, lookup: Unknown("not asked in this race"),
            key_retention=timedelta(days=1),
        )
    )
    return settings


def _hold(middle: Barrier | None, done: Any) -> Any:
    """A fault point's action: wait for the other side at ``middle``, then until it is
    done, so that its whole transaction commits between this side's read and write."""

    def action(context: Any) -> None:
        assert middle is not None
        middle.wait(BARRIER_SECONDS)
        if not done.wait(BARRIER_SECONDS):
            raise RuntimeError("the other side never finished")

    return action


def shared_step(
    side: str,
    url: str,
    pseudonym_key: bytes,
    execution_id: str,
    key: str,
    sabotage: Sequence[str],
    start: Barrier,
    middle: Barrier | None,
    done: Any,
    hold: str,
    results: Queue[dict[str, Any]],
) -> None:
    """One side of the shared-record race (``_undo_side``, ``_replay_side``): open a
    store, switch ``sabotage`` off, meet the other side at ``start`` and report the
    side's outcome. The held side (``hold == side``) pauses at its fault point until the
    other side is ``done``; the other side waits at ``middle`` for that pause first."""
    from celery_agboss.core import sabotage as switches
    from celery_agboss.testing.fault_arming import arm_fault

    other_held = hold not in ("none", side)
    store = None
    try:
        sides = {"undo": _undo_side, "replay": _replay_side}
        point, work = sides[side](pseudonym_key, execution_id, key)
        store = _open_store(url, _Zero())
        if hold == side:
            arm_fault(point, _hold(middle, done))
        with switches.switched_off(*sabotage) if sabotage else contextlib.nullcontext():
            start.wait(BARRIER_SECONDS)
            if other_held:
                assert middle is not None
                middle.wait(BARRIER_SECONDS)
            outcome = work(store)
        if other_held:
            done.set()
        results.put({"side": side, "outcome": outcome, "error": None})
    except BaseException as exc:
        start.abort()
        if middle is not None:
            middle.abort()
        results.put({"side": side, "error": f"{exc!r}\n{traceback.format_exc()}"})
    finally:
        if store is not None:
            store.close()


Work = tuple[str, Callable[[Any], str]]  # (the fault point the side is held at, its work)


def _undo_side(pseudonym_key: bytes, execution_id: str, step_key: str) -> Work:
    """Decide (and claim, when it undoes) the undo of ``step_key`` as a failing
    execution does (``core.compensation.decide_step``); held between the decision and
    the claim."""
    from celery_agboss.core.compensation import UndoContext, UndoDeclaration, decide_step
    from celery_agboss.core.execution_context import ExecutionContext
    from celery_agboss.core.store_protocol import INTENT_RECORD
    from celery_agboss.testing.fault_arming import UNDO_BEFORE_CLAIM

    def work(store: Any) -> str:
        settings = shared_settings(pseudonym_key)
        with ExecutionContext.start(store, execution_id, settings) as ctx:
            declaration = UndoDeclaration(1, step_key, "refund", {}, kind=INTENT_RECORD)
            return decide_step(UndoContext.over(ctx), declaration).outcome.value

    return UNDO_BEFORE_CLAIM, work


def _replay_side(pseudonym_key: bytes, execution_id: str, business_key: str) -> Work:
    """Call the shared step as another execution's body does: ``relied`` (its reliance
    written) or ``compensated`` (refused as undone); held between the read of the record
    and the reliance."""
    from celery_agboss.core import state_machine
    from celery_agboss.core.execution_context import ExecutionContext
    from celery_agboss.errors import OutboundCallCompensatedError
    from celery_agboss.testing.fault_arming import OUTBOUND_BEFORE_RELY

    state_machine.COMPENSATION_WAIT_S = 0.05  # the undo here is claimed, never run

    def work(store: Any) -> str:
        settings = shared_settings(pseudonym_key)
        call = settings.registry[SHARED_CALL]
        with ExecutionContext.start(store, execution_id, settings) as ctx:
            try:
                ctx.outbound(call, SHARED_REQUEST, business_key=business_key)
            except OutboundCallCompensatedError:
                return "compensated"
            return "relied"

    return OUTBOUND_BEFORE_RELY, work


class _Zero:
    """A clock offset of zero, shaped like the shared ``multiprocessing.Value``."""

    value = 0


EARLY_ANSWER_MODES = ("answer-first", "pause-first", "together")
"""The early-answer race's rounds: the answer committed before the pause's write, after
it, or both released at the same instant (then the execution row's lock orders them)."""


def early_answer_side(
    side: str,
    url: str,
    rounds: Sequence[tuple[str, Any, str]],
    sabotage: Sequence[str],
    start: Barrier,
    middle: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """One side of the early-answer race, one execution per round: ``"pause"`` reaches
    ``self.pause("3ds", accept_early=True)`` under the round's lease, ``"answer"`` answers
    that pause. Each round starts at ``start`` and meets again at ``middle``; who acts
    before ``middle`` and who after is the round's mode."""
    from celery_agboss.core import sabotage as switches
    from celery_agboss.errors import NotPausedError
    from celery_agboss.store.execution_store import SQLAlchemyExecutionStore

    store = None
    try:
        store = _open_store(url, _Zero())
        executions = SQLAlchemyExecutionStore(store)
        store.now_ms()  # connect before the race, not during it

        def act(lease: Any) -> dict[str, Any]:
            if side == "pause":
                with store.fenced(lease, 30_000) as tx:
                    taken, answer = executions.pause_in(tx, "3ds", '"pay"', accept_early=True)
                return {"taken": taken, "answer": answer}
            try:
                answered = executions.answer_pause(f"{lease.scope}:3ds", '"authenticated"')
            except NotPausedError as refused:
                return {"refused": str(refused)}
            return {"early": answered.early}

        with switches.switched_off(*sabotage) if sabotage else contextlib.nullcontext():
            for number, lease, mode in rounds:
                first = (side == "answer") == (mode == "answer-first") or mode == "together"
                start.wait(BARRIER_SECONDS)
                outcome = act(lease) if first else None
                middle.wait(BARRIER_SECONDS)
                if outcome is None:
                    outcome = act(lease)
                results.put({"side": side, "round": number, **outcome, "error": None})
    except BaseException as exc:
        start.abort()
        middle.abort()
        results.put({"side": side, "round": -1, "error": f"{exc!r}\n{traceback.format_exc()}"})
    finally:
        if store is not None:
            store.close()


# --- the parent's side ---------------------------------------------------------------


@contextlib.contextmanager
def sabotage_allowed_in_children(wanted: bool) -> Iterator[None]:
    """A spawned child may switch a protection off only as a descendant of this pytest
    process, named in its environment (``celery_agboss.core.sabotage``)."""
    if not wanted:
        yield
        return
    before = os.environ.get(SUBPROCESS_SWITCH)
    os.environ[SUBPROCESS_SWITCH] = str(os.getpid())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SUBPROCESS_SWITCH, None)
        else:
            os.environ[SUBPROCESS_SWITCH] = before


def next_row(results: Queue[Any], timeout: float, missing: str) -> Any:
    """The next row a child reported; a child silent for ``timeout`` fails the test with
    ``missing``."""
    try:
        return results.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(missing) from None


def stop_all(processes: Sequence[BaseProcess]) -> None:
    """Join every child; kill those still running (the test is over either way)."""
    for process in processes:
        process.join(10)
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(10)
