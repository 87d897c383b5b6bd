"""A fenced effect's transaction is Django's, on the store's alias.

``fn``'s ORM writes (``Order.objects.filter(...).update(...)``, no connection passed)
go through Django's connection to the alias; so the fence check, ``fn`` and the
effect's record run there too, inside ``transaction.atomic(using=alias,
durable=True)``: one database transaction, committed once the store's checks passed
(a holder that lost its lease commits nothing, its ORM writes included), rolled back
on any error. ``durable``: inside the body's own ``atomic`` the fence would be a
savepoint, holding the lease row locked until the outer block ends, so that is
refused. While it is open, a write to another alias is refused: it would commit on
its own, zombie or not; and so is ``COMMIT`` (or its kin) sent as SQL text through
Django's cursor on the alias itself: it would commit ``fn``'s writes on the first
lease check alone, the store's ``CommitGuard`` rule (``ends_transaction``) applied
where SQLAlchemy never sees the statement. ``transaction.on_commit`` hooks ``fn``
registers run after that commit as Django's robust ones (a raising hook never un-does a
committed effect); a connection out of autocommit, whose ``atomic`` never commits, is
refused.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections, transaction
from sqlalchemy.engine import Engine

from celery_agboss.core import sabotage
from celery_agboss.core.protections import (
    DJANGO_COMMIT_TEXT_PASSES,
    DJANGO_OTHER_ALIAS_WRITES_PASS,
    DJANGO_PUBLISH_BEFORE_COMMIT,
    DJANGO_SILENT_ROLLBACK_PASSES,
    DJANGO_WRITES_OFF_THE_FENCE,
)
from celery_agboss.errors import (
    CommitInsideFencedEffectError,
    ConfigurationError,
    FencedEffectInsideAtomicError,
    OutsideFenceWriteError,
    StoreUnavailableError,
)
from celery_agboss.store.borrowed import OpenTransaction, UsersDatabase, borrowed_engine
from celery_agboss.store.commit_guard import ends_transaction
from celery_agboss.store.driver_errors import translated

# What a statement on another alias may be while a fenced effect runs: a read, or what
# Django sends around one (SQLite's atomic() opens with BEGIN through its cursor; a
# savepoint rolled back sends ROLLBACK TO).
_READ = re.compile(
    r"\s*(SELECT|SHOW|EXPLAIN|PRAGMA|SAVEPOINT|RELEASE|BEGIN|ROLLBACK\s+TO)\b", re.IGNORECASE
)


def transactions_on(store_engine: Engine, alias: str) -> UsersDatabase:
    """Django's transactions on ``alias`` (``runtime.django_store``'s factory)."""
    return DjangoDatabase(store_engine, alias)


@dataclass(frozen=True)
class DjangoDatabase:
    """The store's alias as Django's transactions use it (``store.UsersDatabase``)."""

    store_engine: Engine
    alias: str

    def fenced_transaction(self) -> contextlib.AbstractContextManager[Engine | None]:
        return _in_django_transaction(self.store_engine, self.alias)

    def open_transaction(self) -> OpenTransaction | None:
        """The caller's ``atomic`` on the alias, where a publish is recorded and from
        which it is sent once it commits (``transaction.on_commit``)."""
        connection = connections[self.alias]
        if not connection.in_atomic_block or sabotage.active(DJANGO_PUBLISH_BEFORE_COMMIT):
            return None
        connection.ensure_connection()
        alias = self.alias
        return OpenTransaction(
            borrowed_engine(self.store_engine, connection.connection),
            lambda then: transaction.on_commit(then, using=alias),
        )


@contextlib.contextmanager
def _in_django_transaction(store_engine: Engine, alias: str) -> Iterator[Engine | None]:
    if sabotage.active(DJANGO_WRITES_OFF_THE_FENCE):
        yield None  # the store's own connection: the ORM's writes commit by themselves
        return
    connection = connections[alias]
    if connection.in_atomic_block:
        raise FencedEffectInsideAtomicError(
            f"a fenced effect was called inside transaction.atomic() on {alias!r}: its fence "
            "would be a savepoint holding the lease row locked until that block ends; call "
            "self.fenced_effect(...) outside any atomic block (it opens its own)"
        )
    with translated():
        autocommit = connection.get_autocommit()  # connects: a lost server is the store's
    if not autocommit:
        raise ConfigurationError(
            f'Django\'s connection to {alias!r} is not in autocommit mode ("AUTOCOMMIT": '
            "False, or set_autocommit(False)): its atomic() would never commit a fenced "
            "effect, its writes and record lost; remove AUTOCOMMIT from DATABASES, or call "
            "set_autocommit(True) before the task runs"
        )
    atomic = transaction.atomic(using=alias, durable=True)
    with translated():  # SQLite's BEGIN IMMEDIATE past its busy timeout: the store's trouble
        atomic.__enter__()
    try:
        with _other_aliases_read_only(alias), connection.execute_wrapper(_refuse_ending(alias)):
            with translated():
                connection.ensure_connection()
            yield borrowed_engine(store_engine, connection.connection)
        if connection.needs_rollback and not sabotage.active(DJANGO_SILENT_ROLLBACK_PASSES):
            # Django would roll back at the block's end without a word, and the effect
            # would pass for written: it is refused instead (its writes roll back).
            raise CommitInsideFencedEffectError(
                "fn marked the fenced effect's transaction for rollback "
                "(transaction.set_rollback(True), or an error swallowed inside "
                "atomic(savepoint=False)); nothing of it was written",
                method="set_rollback",
            )
    except BaseException:
        atomic.__exit__(*sys.exc_info())  # rolls back; the error goes on
        raise
    _hooks_run_robustly(connection)
    try:
        atomic.__exit__(None, None, None)
    except DatabaseError as exc:
        raise StoreUnavailableError(
            f"the commit of a fenced effect on Django's {alias!r} database failed, so its "
            f"outcome is unknown ({type(exc).__name__}); the delivery is retried and finds "
            "the effect recorded, or runs it again"
        ) from exc


def _hooks_run_robustly(connection: Any) -> None:
    """``transaction.on_commit`` hooks ``fn`` registered run after the commit, inside
    ``atomic``'s exit: one raising there (a receipt e-mail's SMTP error) would reach the
    body as the effect's failure, though it committed, and its undos would run (a refund
    of a paid order). They run as Django runs its ``robust=True`` hooks instead: each
    one, its error logged by Django, the committed effect returned."""
    connection.run_on_commit = [(sids, hook, True) for sids, hook, _ in connection.run_on_commit]


@contextlib.contextmanager
def _other_aliases_read_only(alias: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for other in connections:
            if other != alias:
                stack.enter_context(connections[other].execute_wrapper(_refuse_writes(other)))
        yield


def _refuse_writes(alias: str) -> Callable[..., Any]:
    def refuse(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if not _READ.match(sql) and not sabotage.active(DJANGO_OTHER_ALIAS_WRITES_PASS):
            raise OutsideFenceWriteError(
                f"a write to the database {alias!r} inside a fenced effect is refused: it "
                "would commit on its own, even for a holder whose lease is gone; write to "
                "the store's database only, or in a fenced effect of its own task"
            )
        return execute(sql, params, many, context)

    return refuse


def _refuse_ending(alias: str) -> Callable[..., Any]:
    """Refuse, before it runs, a statement on the fence's own alias that would end its
    transaction (design: P2): the writes before it would commit without the commit-time
    lease check and the effect's record, so a holder that lost its lease meanwhile has
    written, and the next holder writes again. Savepoints (``atomic()`` inside ``fn``)
    pass. Refused before it is sent, the transaction stays open and whole."""

    def refuse(execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any) -> Any:
        ends = ends_transaction(sql) if isinstance(sql, str | bytes) else None
        if ends and not sabotage.active(DJANGO_COMMIT_TEXT_PASSES):
            raise CommitInsideFencedEffectError(
                f"{ends} sent as SQL text through Django's cursor on {alias!r} inside a "
                "fenced effect is refused: fn's writes commit with the lease check and the "
                "effect's record, or not at all. Leave the commit to the fenced effect (an "
                "atomic() inside fn is a savepoint of its transaction)",
                method=f"{ends} sent as SQL text",
            )
        return execute(sql, params, many, context)

    return refuse


__all__ = ["transactions_on"]
