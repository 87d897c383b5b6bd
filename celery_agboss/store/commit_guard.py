"""The rule that code inside a store transaction (a fenced effect's ``fn``) may not end it.

Its writes commit with the lease check and the effect's record, or not at all: a
``commit()``, ``rollback()`` or ``close()`` of the transaction's connection, a commit
reaching the transaction another way (its ``Transaction``, an ORM session joined
without a savepoint), and ``COMMIT`` or its kin sent as SQL text are refused while
the store's own transaction is open. ``SQLAlchemyStore`` opens each transaction on a
``StoreConnection`` with a ``CommitGuard``, and installs the checks on its engine once
(``guard_engine``).
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from celery_agboss.core import sabotage
from celery_agboss.core.protections import COMMIT_INSIDE_FENCED_EFFECT_ALLOWED
from celery_agboss.core.sealing import PLAINTEXT, Sealer
from celery_agboss.errors import CommitInsideFencedEffectError


class CommitGuard:
    """The one guard of the rule that code run inside a store transaction (a fenced
    effect's ``fn``) may not end it: its writes commit with the lease check and the
    effect's record, or not at all. Savepoints (an ORM session joined with
    ``join_transaction_mode='create_savepoint'``) pass.

    ``commit()``, ``rollback()`` and ``close()`` on the connection are refused before
    they touch the transaction (``StoreConnection``), so code that catches the refusal
    goes on in the same open transaction. The connection's ``commit`` and ``rollback``
    events refuse what reaches the transaction another way (its ``Transaction`` object,
    an ORM session joined without a savepoint); that refused transaction is rolled back.
    ``COMMIT`` and its kin sent as SQL text are refused before they run."""

    def __init__(self, conn: Connection) -> None:
        self.allowed = True  # until our own BEGIN has succeeded
        if isinstance(conn, StoreConnection):
            conn.agboss_guard = self

    def refuse(self, method: str) -> None:
        """Raise ``CommitInsideFencedEffectError`` unless the store itself is ending it."""
        if not self.allowed:
            raise CommitInsideFencedEffectError(
                f"{method} inside a store transaction (a fenced effect's fn) is refused: its "
                "writes commit with the lease check and the effect's record, or not at all. "
                "For an ORM session use "
                "Session(bind=conn, join_transaction_mode='create_savepoint')",
                method=method,
            )

    def _check_commit(self, _conn: Connection) -> None:
        self.refuse("commit()")

    def _check_rollback(self, _conn: Connection) -> None:
        self.refuse("rollback()")

    def _check_statement(self, conn: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        """``COMMIT`` (or ``END``, ``ROLLBACK``, ``BEGIN``) sent as SQL text would end the
        transaction behind SQLAlchemy's back: the writes before it would commit without
        the commit-time lease check and without the effect's record. Savepoints pass."""
        if self.allowed or sabotage.active(COMMIT_INSIDE_FENCED_EFFECT_ALLOWED):
            return
        ends = ends_transaction(statement)
        if ends:
            self.refuse(f"{ends} sent as SQL text")


_GUARDED_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()
_GUARDING = threading.Lock()


def guard_engine(engine: Engine) -> None:
    """The ``CommitGuard`` checks as engine events, installed once per engine: events
    listened to on each transaction's connection cost more than its statements (about
    1 ms a transaction, measured), so each event finds its connection's guard instead."""
    with _GUARDING:
        if engine in _GUARDED_ENGINES:
            return
        event.listen(engine, "commit", _on_commit)
        event.listen(engine, "rollback", _on_rollback)
        event.listen(engine, "before_cursor_execute", _on_statement)
        _GUARDED_ENGINES.add(engine)


def _guard_of(conn: Connection) -> CommitGuard | None:
    guard: CommitGuard | None = getattr(conn, "agboss_guard", None)
    return guard


def _on_commit(conn: Connection) -> None:
    guard = _guard_of(conn)
    if guard is not None:
        guard._check_commit(conn)


def _on_rollback(conn: Connection) -> None:
    guard = _guard_of(conn)
    if guard is not None:
        guard._check_rollback(conn)


def _on_statement(conn: Connection, cursor: Any, statement: str, *rest: Any) -> None:
    guard = _guard_of(conn)
    if guard is not None:
        guard._check_statement(conn, cursor, statement, *rest)


class StoreConnection(Connection):
    """The connection of one store transaction: while its ``CommitGuard`` is closed,
    ``commit()``, ``rollback()`` and ``close()`` are refused before SQLAlchemy changes
    anything (an ORM ``Session`` still takes it: it is a ``Connection``)."""

    agboss_guard: CommitGuard | None = None
    agboss_sealer: Sealer = PLAINTEXT
    """What this transaction's sealed columns are sealed and opened with (``store.
    sealed_columns``)."""

    def _refuse(self, method: str) -> None:
        guard = self.agboss_guard
        if guard is not None and not sabotage.active(COMMIT_INSIDE_FENCED_EFFECT_ALLOWED):
            guard.refuse(method)

    def commit(self) -> None:
        self._refuse("commit()")
        super().commit()

    def rollback(self) -> None:
        self._refuse("rollback()")
        super().rollback()

    def close(self) -> None:
        self._refuse("close()")
        super().close()


_ENDS_TRANSACTION = re.compile(
    r"\s*;*\s*(COMMIT|END|ABORT|BEGIN|START\s+TRANSACTION|PREPARE\s+TRANSACTION"
    r"|ROLLBACK(?!(\s+(WORK|TRANSACTION))?\s+TO\b))\b",
    re.IGNORECASE,
)


_DOLLAR_TAG = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


def _quoted_end(text: str, start: int) -> int:
    """Where the literal or quoted name opening at ``start`` ends (after its quote): a
    doubled quote stays inside, and so does a backslash-escaped one in an ``E'…'``."""
    quote = text[start]
    escapes = quote == "'" and start > 0 and text[start - 1] in "eE"
    i = start + 1
    while i < len(text):
        if escapes and text[i] == "\\":
            i += 2
        elif text[i] != quote:
            i += 1
        elif text.startswith(quote * 2, i):
            i += 2
        else:
            return i + 1
    return len(text)


def _comment_end(text: str, start: int) -> int:
    """Where the comment opening at ``start`` ends: a line's, or a block's (nested, as
    PostgreSQL nests them)."""
    if text.startswith("--", start):
        end = text.find("\n", start)
        return len(text) if end < 0 else end + 1
    depth, i = 1, start + 2
    while i < len(text) and depth:
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
        else:
            i += 1
    return i


def _statements(text: str) -> list[str]:
    """The statements of ``text`` (PostgreSQL runs several in one ``execute`` when it has no
    parameters), split at semicolons outside literals and comments; a literal stands as
    ``x`` and a comment as a space, so neither reads as a verb."""
    statements: list[str] = []
    piece: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        tag = _DOLLAR_TAG.match(text, i) if char == "$" else None
        if char in "'\"":
            i, filler = _quoted_end(text, i), " x "
        elif text.startswith(("--", "/*"), i):
            i, filler = _comment_end(text, i), " "
        elif tag is not None:
            close = text.find(tag.group(0), tag.end())
            i, filler = (len(text) if close < 0 else close + len(tag.group(0))), " x "
        elif char == ";":
            statements.append("".join(piece))
            piece, i, filler = [], i + 1, ""
        else:
            i, filler = i + 1, char
        piece.append(filler)
    statements.append("".join(piece))
    return statements


def ends_transaction(statement: str | bytes) -> str | None:
    """The verb (``COMMIT``, ``END``, ``ROLLBACK``, ``BEGIN``…) when ``statement``, or any
    statement in it, ends or restarts the transaction it is sent in, else None;
    ``ROLLBACK TO`` and other savepoint statements pass. The one statement rule of a
    fenced transaction, whichever connection sends it: the store's own
    (``CommitGuard``) or Django's cursor (contrib.django). Comments before the verb,
    and a verb after another statement's semicolon, are seen; a verb in a literal is
    not one."""
    if isinstance(statement, bytes):
        statement = statement.decode("utf-8", "replace")
    plain = not any(mark in statement for mark in (";", "--", "/*"))
    for one in [statement] if plain else _statements(statement):
        ends = _ENDS_TRANSACTION.match(one)
        if ends:
            return " ".join(ends.group(1).upper().split())
    return None


def is_store_engine(engine: Engine) -> bool:
    """Whether a store runs on ``engine`` (``guard_engine`` was called for it)."""
    return engine in _GUARDED_ENGINES


__all__ = ["CommitGuard", "StoreConnection", "ends_transaction", "guard_engine", "is_store_engine"]
