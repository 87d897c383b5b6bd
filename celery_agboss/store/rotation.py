"""``agboss rotate-keys``: every sealed column re-sealed with the ring's first key, and
every value written before encryption was on sealed (design: sealed at rest); the
argument reprs a row written in clear kept in its options are dropped, as a sealed
store's writes drop them.

A batch is one short transaction. On PostgreSQL it locks its rows ``FOR UPDATE SKIP
LOCKED`` (a row a worker is writing is skipped, never waited for) and writes them back in
the same transaction. On SQLite it reads the batch without the write lock and writes it
back in a transaction of its own. Either way each write is a compare-and-set on the old
stored text, so a result settled between the read and the write is never replaced by the
old value; a row so raced, or skipped, is taken by the next pass. Nothing is kept between
runs: a run stopped half-way resumes where the rows say.

A value no configured key opens (its key dropped before the run reached it) is left as
it is and named in the report, and the run goes on: stopping there, every run would
stop at the same row and the rotation never end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, and_, bindparam, func, or_, select, update
from sqlalchemy.engine import Connection

from celery_agboss.core import sabotage
from celery_agboss.core.fault_points import RESEAL_BEFORE_WRITE, fault_point
from celery_agboss.core.protections import RESEAL_WITHOUT_COMPARE_AND_SET
from celery_agboss.core.sealing import SEALED_PREFIX, SealedAt, Sealer, sealed_key_id
from celery_agboss.errors import ConfigurationError, SealedValueUnopenableError
from celery_agboss.store.schema import metadata
from celery_agboss.store.sealed_columns import (
    SEALED_COLUMNS,
    settle_encryption_flag,
    without_argument_reprs,
)
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

DEFAULT_BATCH = 200
MAX_PASSES = 5
"""A pass ends when its cursor reaches the table's end; the rows a pass skipped (locked,
or raced) are taken by the next, up to this many."""


@dataclass(frozen=True)
class Unopenable:
    """A stored value no configured key opens: where it is, and the key that sealed it."""

    table: str
    column: str
    row_key: str  # the row's key columns, joined by ":"
    key_id: str

    def as_dict(self) -> dict[str, str]:
        return {
            "table": self.table,
            "column": self.column,
            "row_key": self.row_key,
            "key_id": self.key_id,
        }


@dataclass
class RotationReport:
    """What a run re-sealed, per ``table.column``, and what it left for the next run:
    ``unopenable`` (counted in ``left`` too) needs the key that sealed it first."""

    sealing_key: str
    resealed: dict[str, int] = field(default_factory=dict)
    left: dict[str, int] = field(default_factory=dict)
    unopenable: list[Unopenable] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.resealed.values())

    @property
    def complete(self) -> bool:
        return not any(self.left.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "sealing_key": self.sealing_key,
            "resealed": dict(self.resealed),
            "left": dict(self.left),
            "unopenable": [value.as_dict() for value in self.unopenable],
            "complete": self.complete,
        }


def rotate_keys(
    store: SQLAlchemyStore,
    *,
    batch_size: int = DEFAULT_BATCH,
    on_batch: Callable[[str, int], None] | None = None,
) -> RotationReport:
    """Re-seal every sealed column with ``store.sealer``'s first key."""
    sealer = store.sealer
    if sealer.ring is None:
        raise ConfigurationError(
            "rotate-keys needs agboss_encryption_keys (the first key is the one values are "
            "re-sealed with)",
            setting="agboss_encryption_keys",
        )
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    with store.transaction() as tx:
        settle_encryption_flag(tx.connection, sealer)  # from now on, no process writes in clear
    report = RotationReport(sealing_key=sealer.ring.sealing_key_id)
    for table_name, (key_columns, columns) in SEALED_COLUMNS.items():
        table = metadata.tables[table_name]
        for column in columns:
            name = f"{table_name}.{column}"
            column_job = _Column(store, sealer, table, key_columns, column, batch_size)
            report.resealed[name] = column_job.run(on_batch)
            report.left[name] = column_job.left()
            report.unopenable += column_job.unopenable.values()
    executions = metadata.tables["agboss_executions"]
    reprs = _ArgumentReprs(store, sealer, executions, ("id",), "options", batch_size)
    name = "agboss_executions.options"
    report.resealed[name] = reprs.run(on_batch)
    report.left[name] = reprs.left()
    return report


@dataclass
class _Column:
    store: SQLAlchemyStore
    sealer: Sealer
    table: Table
    key_columns: tuple[str, ...]
    column: str
    batch_size: int
    unopenable: dict[tuple[Any, ...], Unopenable] = field(default_factory=dict)

    def _not_current(self) -> Any:
        """Stored, and not sealed with the first key (plaintext, or another key)."""
        assert self.sealer.ring is not None
        current = f"{SEALED_PREFIX}{self.sealer.ring.sealing_key_id}:"
        value = self.table.c[self.column]
        return and_(value.is_not(None), func.substr(value, 1, len(current)) != current)

    def left(self) -> int:
        with self.store.read_transaction() as tx:
            statement = select(func.count()).select_from(self.table).where(self._not_current())
            return int(tx.execute(statement).scalar() or 0)

    def run(self, on_batch: Callable[[str, int], None] | None) -> int:
        resealed = 0
        for _ in range(MAX_PASSES):
            cursor: tuple[Any, ...] | None = None
            while True:
                written, cursor = self._batch(cursor)
                resealed += written
                if on_batch is not None and written:
                    on_batch(f"{self.table.name}.{self.column}", written)
                if cursor is None:
                    break
            if self.left() <= len(self.unopenable):  # what is left waits for its key
                break
        return resealed

    def _select(self, after: tuple[Any, ...] | None, lock: bool) -> Any:
        keys = [self.table.c[name] for name in self.key_columns]
        statement = select(*keys, self.table.c[self.column]).where(self._not_current())
        if after is not None:
            statement = statement.where(_after(keys, after))
        statement = statement.order_by(*keys).limit(self.batch_size)
        if lock:
            statement = statement.with_for_update(skip_locked=True, of=self.table)
        return statement

    def _batch(self, after: tuple[Any, ...] | None) -> tuple[int, tuple[Any, ...] | None]:
        """One batch: how many rows it re-sealed, and the cursor (None: the table's end)."""
        locked = self.store.dialect_name == "postgresql" and not sabotage.active(
            RESEAL_WITHOUT_COMPARE_AND_SET
        )
        if locked:
            with self.store.transaction() as tx:
                rows = tx.execute(self._select(after, lock=True)).all()
                changes = self._resealed(rows)
                fault_point(RESEAL_BEFORE_WRITE, table=self.table.name, column=self.column)
                return self._write(tx.connection, changes), _cursor(rows, self)
        with self.store.read_transaction() as tx:
            rows = tx.execute(self._select(after, lock=False)).all()
        changes = self._resealed(rows)
        fault_point(RESEAL_BEFORE_WRITE, table=self.table.name, column=self.column)
        with self.store.transaction() as tx:
            return self._write(tx.connection, changes), _cursor(rows, self)

    def _resealed(self, rows: list[Any]) -> list[tuple[tuple[Any, ...], str, str]]:
        changes = []
        for row in rows:
            key = tuple(row[: len(self.key_columns)])
            old = str(row[-1])
            where = SealedAt(self.table.name, self.column, ":".join(map(str, key)))
            try:
                new = self.sealer.reseal(old, where)
            except SealedValueUnopenableError as error:
                # Left as it is, named; the rows after it are re-sealed all the same.
                key_id = str(getattr(error, "key_id", sealed_key_id(old)))
                self.unopenable[key] = Unopenable(where.table, where.column, where.row_key, key_id)
                continue
            if new is not None:
                changes.append((key, old, new))
        return changes

    def _write(self, conn: Connection, changes: list[tuple[tuple[Any, ...], str, str]]) -> int:
        if not changes:
            return 0
        value = self.table.c[self.column]
        guard = [self.table.c[name] == bindparam(f"k_{name}") for name in self.key_columns]
        if not sabotage.active(RESEAL_WITHOUT_COMPARE_AND_SET):
            guard.append(value == bindparam("old"))
        statement = update(self.table).where(*guard).values({self.column: bindparam("new")})
        written = 0
        for key, old, new in changes:
            parameters = {
                f"k_{name}": part for name, part in zip(self.key_columns, key, strict=True)
            }
            written += int(conn.execute(statement, {**parameters, "old": old, "new": new}).rowcount)
        return written


@dataclass
class _ArgumentReprs(_Column):
    """An execution's options as a sealed store writes them: without Celery's display
    copy of the arguments (``without_argument_reprs``), which a row written in clear
    kept; each write a compare-and-set on the options read, as a re-seal is."""

    def _not_current(self) -> Any:
        value = self.table.c[self.column]
        return or_(value.contains('"argsrepr"'), value.contains('"kwargsrepr"'))

    def left(self) -> int:
        with self.store.read_transaction() as tx:
            statement = select(self.table.c[self.column]).where(self._not_current())
            return sum(1 for (old,) in tx.execute(statement) if without_argument_reprs(old) != old)

    def _resealed(self, rows: list[Any]) -> list[tuple[tuple[Any, ...], str, str]]:
        changes = []
        for row in rows:
            old = str(row[-1])
            new = without_argument_reprs(old)
            if new != old:
                changes.append((tuple(row[: len(self.key_columns)]), old, new))
        return changes


def _after(keys: list[Any], after: tuple[Any, ...]) -> Any:
    """Rows after ``after`` in the order of ``keys`` (a row-value comparison, spelled out)."""
    if len(keys) == 1:
        return keys[0] > after[0]
    first, second = keys
    return or_(first > after[0], and_(first == after[0], second > after[1]))


def _cursor(rows: list[Any], job: _Column) -> tuple[Any, ...] | None:
    if len(rows) < job.batch_size:
        return None
    return tuple(rows[-1][: len(job.key_columns)])


__all__ = ["DEFAULT_BATCH", "RotationReport", "Unopenable", "rotate_keys"]
