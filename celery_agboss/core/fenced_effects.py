"""Fenced effects (P2): a write to the store's own database, committed at most once per key,
in the same transaction that checks the lease.

The order is record-and-replay inside one fenced transaction: look the key up; a
record is the answer (after checking the step's name, and the request's fingerprint
when one was given); otherwise run ``fn(conn)`` on the transaction's connection,
store its JSON result under the key, and commit both together. A superseded token
is refused by the fenced transaction itself, before ``fn`` runs. ``fn`` may not end
the transaction: ``commit()``, ``rollback()`` and ``close()`` on the connection it
gets raise ``CommitInsideFencedEffectError`` — its writes commit with the record or
not at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from celery_agboss.core import sabotage
from celery_agboss.core.canonical import ensure_json
from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.keys import (
    business_key,
    business_key_handle,
    fingerprint,
    step_key,
    validate_business_key,
)
from celery_agboss.core.protections import (
    COMMIT_INSIDE_FENCED_EFFECT_ALLOWED,
    RECORD_USE_NOT_NOTED,
)
from celery_agboss.core.store import EFFECT_RECORD, EffectRecord, FencedTransaction, LeaseRef
from celery_agboss.errors import (
    CommitInsideFencedEffectError,
    FencedEffectConflictError,
    IdempotencyKeyConflictError,
)

logger = logging.getLogger("celery_agboss")

MAX_INSERT_ROUNDS = 3


class EffectHolder(Protocol):
    """What a fenced effect needs from the delivery that runs it."""

    @property
    def settings(self) -> EngineSettings: ...

    @property
    def execution_id(self) -> str: ...

    @property
    def lease_ref(self) -> LeaseRef: ...

    def fenced(self) -> AbstractContextManager[FencedTransaction]: ...

    def check_cancel(self, tx: FencedTransaction) -> None:
        """Raise ``CancelRequestedError`` when the execution's cancel was recorded."""


def effect_key(
    settings: EngineSettings,
    execution_id: str,
    name: str,
    business_key_text: str | None,
    occurrence: int,
) -> str:
    """The same grammar as outbound calls, with the effect's name (core/keys.py)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a fenced effect needs a non-empty name, not {name!r}")
    if business_key_text is not None:
        return business_key(settings.tenant, validate_business_key(business_key_text), name)
    return step_key(settings.tenant, execution_id, name, occurrence)


class _LostInsert(Exception):
    """Another transaction recorded the key first: roll this one back (fn's writes too)."""


def run_fenced_effect(
    holder: EffectHolder,
    name: str,
    fn: Callable[[Any], Any],
    *,
    business_key_text: str | None = None,
    request: Any = None,
    occurrence: int = 1,
) -> Any:
    """Replay the recorded result, or run ``fn(conn)`` and record its result, in one fenced
    transaction."""
    settings = holder.settings
    key = effect_key(settings, holder.execution_id, name, business_key_text, occurrence)
    wanted = None if request is None else fingerprint(settings.pseudonym_key, request)
    log_ref = _log_ref(settings, holder.execution_id, name, key, business_key_text)
    for _ in range(MAX_INSERT_ROUNDS):
        try:
            with holder.fenced() as tx:
                holder.check_cancel(tx)  # before a replay too: the body stops here
                record = tx.read_effect(key)
                if record is not None:
                    replayed = _replay(record, name, wanted, log_ref)
                    if record.execution_id != holder.execution_id and not sabotage.active(
                        RECORD_USE_NOT_NOTED
                    ):
                        # Kept while this execution lives (DESIGN §6.3).
                        tx.record_use(EFFECT_RECORD, key, holder.execution_id)
                    return replayed
                result = _run(fn, tx.connection)
                try:
                    ensure_json(result)
                except TypeError as exc:
                    raise TypeError(f"fenced effect {name!r} must return JSON: {exc}") from None
                inserted = tx.insert_effect(
                    EffectRecord(
                        key=key,
                        execution_id=holder.execution_id,
                        name=name,
                        result=result,
                        token=holder.lease_ref.token,
                        created_at_ms=tx.now_ms,
                        fingerprint=wanted,
                    )
                )
                if not inserted:
                    raise _LostInsert()
            logger.info(
                "fenced-effect.applied: %s",
                name,
                extra={"event": "fenced-effect.applied", **log_ref},
            )
            return result
        except _LostInsert:
            continue  # the winner's record is read (and replayed) in a new transaction
    raise RuntimeError(f"fenced effect {name!r}: its key kept being recorded and lost")


def _log_ref(
    settings: EngineSettings, execution_id: str, name: str, key: str, business: str | None
) -> dict[str, Any]:
    ref: dict[str, Any] = {"effect": name, "execution_id": execution_id}
    if business is None:
        ref["effect_key"] = key
    else:
        ref["business_key_handle"] = business_key_handle(settings.pseudonym_key, business)
    return ref


def _replay(record: EffectRecord, name: str, wanted: str | None, log_ref: dict[str, Any]) -> Any:
    if record.name != name:
        raise FencedEffectConflictError(
            f"the key of fenced effect {name!r} was recorded by a step named {record.name!r}; "
            "a renamed step gets no old result",
            effect=name,
            recorded=record.name,
        )
    if wanted is not None and record.fingerprint is not None and record.fingerprint != wanted:
        raise IdempotencyKeyConflictError(
            f"fenced effect {name!r} was recorded with another request; nothing was written",
            effect=name,
        )
    logger.info(
        "fenced-effect.replayed: %s", name, extra={"event": "fenced-effect.replayed", **log_ref}
    )
    return record.result


def _run(fn: Callable[[Any], Any], conn: Any) -> Any:
    if sabotage.active(COMMIT_INSIDE_FENCED_EFFECT_ALLOWED):
        return fn(conn)
    with _refusing_commit(conn) as guarded:
        return fn(guarded)


def _refuse(what: str) -> Callable[..., Any]:
    def refused(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise CommitInsideFencedEffectError(
            f"{what}() inside a fenced effect is refused: the effect's writes commit with its "
            "record, in the transaction that checked the lease. For an ORM session use "
            "Session(bind=conn, join_transaction_mode='create_savepoint')",
            method=what,
        )

    refused.__name__ = what
    return refused


_REFUSED = {name: _refuse(name) for name in ("commit", "rollback", "close")}
_guarded_classes: dict[type[Any], type[Any]] = {}


def _guarded_class(cls: type[Any]) -> type[Any]:
    guarded = _guarded_classes.get(cls)
    if guarded is None:
        guarded = type(f"FencedEffect{cls.__name__}", (cls,), {**_REFUSED, "__module__": __name__})
        _guarded_classes[cls] = guarded
    return guarded


class _Proxy:
    """For connections whose class cannot be swapped: forwards everything but the refusals."""

    def __init__(self, conn: Any) -> None:
        object.__setattr__(self, "_conn", conn)

    def __getattr__(self, name: str) -> Any:
        if name in _REFUSED:
            return _REFUSED[name].__get__(self)
        return getattr(object.__getattribute__(self, "_conn"), name)


@contextmanager
def _refusing_commit(conn: Any) -> Iterator[Any]:
    """The same connection object, its class swapped for one that refuses to end the
    transaction — so the ORM (which checks it is a real ``Connection``) still accepts it."""
    original = type(conn)
    try:
        conn.__class__ = _guarded_class(original)
    except TypeError:
        yield _Proxy(conn)
        return
    try:
        yield conn
    finally:
        conn.__class__ = original


__all__ = ["EffectHolder", "effect_key", "run_fenced_effect"]
