"""The store's deployment id: the tenant of every idempotency key, unless ``agboss_tenant``
says otherwise (docs/keys.md).

The migration that creates an empty store mints it (revision 0007, insert-if-absent);
a store upgraded while it held executions keeps ``"default"``, the tenant its keys in
flight were made with. Nothing mints one at run time: a store without the row was not
migrated, and the caller says so (``Runtime.engine_settings``).

A copy of the store (a copied file, ``CREATE DATABASE … TEMPLATE``, a restored backup)
carries the id, so on one gateway account it sends the original's keys. ``migrate``
records where the id was minted (``PLACE_META_KEY``); a store found elsewhere is a copy
(``PlaceCheck``), said by ``agboss migrate``, ``agboss checklist`` and a WARNING at a
worker's start, and an operator gives it a fresh id (``new_deployment_id``) or records
that it replaces the original (``same_deployment``).
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import func, inspect, select, text
from sqlalchemy.engine import Connection

from celery_agboss.core.executions import TERMINAL_STATES
from celery_agboss.core.sealing import ENCRYPTION_META_KEY
from celery_agboss.errors import (
    OperatorRefusedError,
    StoreError,
    StoreNotMigratedError,
    StoreUnavailableError,
)
from celery_agboss.store.audit_trail import insert_audit_txn
from celery_agboss.store.driver_errors import translated
from celery_agboss.store.schema import outbound_calls
from celery_agboss.store.schema_executions import executions, meta
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore

TENANT_META_KEY = "deployment.tenant"
"""The ``agboss_meta`` row that holds the deployment id (revision 0007 spells it too)."""


def read_store_tenant(store: SQLAlchemyStore) -> str | None:
    """The deployment id the store holds, or None when it holds none (never migrated to
    revision 0007, or no ``agboss_meta`` at all). An unreachable store raises."""
    return read_store_meta(store)[0]


def read_store_meta(store: SQLAlchemyStore) -> tuple[str | None, bool]:
    """``read_store_tenant``'s answer and, in the same read, whether the store holds
    sealed values (``encryption`` = ``on``): what a process reads once before its first
    lease. A store found away from where its id was minted (a copy) logs one WARNING
    (``PlaceCheck.copy_warning``); it is never refused: a restore must start."""
    wanted = (TENANT_META_KEY, ENCRYPTION_META_KEY, PLACE_META_KEY)
    try:
        with store.read_transaction() as tx:
            rows = tx.execute(select(meta.c.key, meta.c.value).where(meta.c.key.in_(wanted)))
            found = {str(row.key): str(row.value) for row in rows}
            if PLACE_META_KEY in found:  # a store of this version: is it where its id was made?
                _warn_if_copy(found, tx.connection)
    except StoreUnavailableError:
        raise
    except StoreError:
        if _has_meta_table(store):
            raise
        return None, False
    return found.get(TENANT_META_KEY), found.get(ENCRYPTION_META_KEY) == "on"


def _has_meta_table(store: SQLAlchemyStore) -> bool:
    with translated(), store.engine.connect() as conn:
        return bool(inspect(conn).has_table(meta.name))


# --- where the id was minted: a copy of the store keeps the id ---------------------------

PLACE_META_KEY = "deployment.place"
"""The ``agboss_meta`` row naming where the store's deployment id was minted (or where an
operator last said the store is the same deployment): a copied store carries the id with
it, and this row is how a copy finds out it is not where the id was made."""

_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"  # what revision 0007 mints from
_LENGTH = 10
_ACTION = "new-deployment-id"
_SHOWN = 5
logger = logging.getLogger("celery_agboss")


@dataclass(frozen=True)
class PlaceCheck:
    """The store's deployment id, where it was minted (``recorded``) and where the store is
    now (``current``); None where a side is unknown (no row yet, no privilege)."""

    deployment_id: str | None
    recorded: str | None
    current: str | None

    @property
    def is_copy(self) -> bool:
        """The store answers from another place than the one its id was minted at (one
        SQLite file reached by two paths is one place: ``same_place``)."""
        if self.recorded is None or self.current is None:
            return False
        return not same_place(self.recorded, self.current)

    def copy_warning(self) -> str:
        """What an operator reads about a copy: the keys it shares, the two choices."""
        return (
            f"this store is a copy: its deployment id {self.deployment_id!r} was minted at "
            f"{shown_place(self.recorded)} and the store is now at "
            f"{shown_place(self.current)}. A copy (a copied "
            "SQLite file, CREATE DATABASE … TEMPLATE, a restored backup, a staging copy of "
            "production) sends the original's idempotency keys: on the original's gateway "
            "account its order is marked paid with the original's payment. If the original "
            "still runs on the same gateway account, stop this copy's workers and run "
            "`celery -A proj agboss migrate --new-deployment-id`; if this store replaces the "
            "original (a restore, a move), run `celery -A proj agboss migrate "
            "--same-deployment` to record its new place."
        )


def current_place(conn: Connection) -> str | None:
    """Where the store answers from: PostgreSQL's cluster (``system_identifier``, kept by
    streaming replicas and failover) and database oid; SQLite's file, by its device and
    inode (``_SQLITE_FILE``, the real path kept beside them). None
    when it cannot be told (no privilege on ``pg_control_system()``, an in-memory file)."""
    if conn.dialect.name == "postgresql":
        row = conn.execute(
            text(
                "SELECT CASE WHEN has_function_privilege("
                "'pg_catalog.pg_control_system()', 'EXECUTE') THEN (SELECT "
                "system_identifier::text FROM pg_catalog.pg_control_system()) END AS sys, "
                "(SELECT oid::text FROM pg_catalog.pg_database "
                "WHERE datname = current_database()) AS db"
            )
        ).one()
        return None if row.sys is None else f"postgresql:system={row.sys};database-oid={row.db}"
    if conn.dialect.name == "sqlite":
        for row in conn.exec_driver_sql("PRAGMA database_list"):
            if row[1] == "main" and row[2]:
                return _sqlite_place(str(row[2]))
    return None


_SQLITE_FILE = "sqlite-file:"
"""A SQLite place: ``sqlite-file:<st_dev>:<st_ino>:<real path>``. The file is the place,
not the path: one file reached by two paths (a hard link, containers mounting one volume
at different paths) is one store, and a copied file is another inode. The path is kept
for the operator. The form before it, ``sqlite:<real path>``, is still read."""
_SQLITE_PATH = "sqlite:"


def _sqlite_place(path: str) -> str | None:
    real = os.path.realpath(path)
    try:
        found = os.stat(real)
    except OSError:
        return None
    return f"{_SQLITE_FILE}{found.st_dev}:{found.st_ino}:{real}"


def _sqlite_file(place: str) -> tuple[tuple[int, int] | None, str] | None:
    """The ``(st_dev, st_ino)`` and path a SQLite place names (a place in the old,
    path-only form: the file its path reaches from here now, None when none), or None
    for a place that is no SQLite file."""
    if place.startswith(_SQLITE_FILE):
        dev, ino, path = place[len(_SQLITE_FILE) :].split(":", 2)
        return (int(dev), int(ino)), path
    if place.startswith(_SQLITE_PATH):
        path = place[len(_SQLITE_PATH) :]
        try:
            found = os.stat(path)
        except OSError:
            return None, path
        return (found.st_dev, found.st_ino), path
    return None


def same_place(recorded: str, current: str) -> bool:
    """Whether two places are one store: the same text, or the same SQLite file however
    its path reads (``_SQLITE_FILE``; an old path-only place when its path reaches this
    very file)."""
    if recorded == current:
        return True
    try:
        a, b = _sqlite_file(recorded), _sqlite_file(current)
    except ValueError:  # not a place this version wrote
        return False
    return a is not None and b is not None and a[0] is not None and a[0] == b[0]


def shown_place(place: str | None) -> str:
    """A place as an operator reads it: a SQLite file by its path (and its inode)."""
    try:
        found = None if place is None else _sqlite_file(place)
    except ValueError:
        found = None
    if found is None or not place or not place.startswith(_SQLITE_FILE):
        return str(place)
    file, path = found
    return f"{path} (device {file[0]}, inode {file[1]})" if file else path


def check_place(conn: Connection) -> PlaceCheck:
    """The store's ``PlaceCheck``, read in the caller's transaction."""
    wanted = (TENANT_META_KEY, PLACE_META_KEY)
    rows = conn.execute(select(meta.c.key, meta.c.value).where(meta.c.key.in_(wanted)))
    found = {str(row.key): str(row.value) for row in rows}
    return PlaceCheck(found.get(TENANT_META_KEY), found.get(PLACE_META_KEY), current_place(conn))


def record_place(conn: Connection, *, replace: bool = False) -> PlaceCheck:
    """Record where the store is as the place of its id: when the id has none yet (minted
    now, or by a version before this row), or, with ``replace``, because an operator said
    this store is the same deployment (a restore replacing the original). Returns the check
    made before writing: ``is_copy`` then says the store was found elsewhere."""
    check = check_place(conn)
    if check.deployment_id is None or check.current is None:
        return check
    if check.recorded is None:
        _write_meta(conn, PLACE_META_KEY, check.current, insert=True)
    elif check.recorded != check.current and (replace or _old_form_of_this_file(check)):
        _write_meta(conn, PLACE_META_KEY, check.current, insert=False)
    return check


def _old_form_of_this_file(check: PlaceCheck) -> bool:
    """A place recorded in the path-only form that names this very file: rewritten in
    the file's form, so the store stays one place when reached by another path later."""
    old = check.recorded is not None and check.recorded.startswith(_SQLITE_PATH)
    return old and not check.is_copy


def _write_meta(conn: Connection, key: str, value: str, *, insert: bool) -> None:
    values = {"key": key, "value": value, "now": time.time_ns() // 1_000_000}
    statement = (
        "INSERT INTO agboss_meta (key, value, updated_at_ms) VALUES (:key, :value, :now) "
        "ON CONFLICT (key) DO NOTHING"
        if insert
        else "UPDATE agboss_meta SET value = :value, updated_at_ms = :now WHERE key = :key"
    )
    conn.execute(text(statement), values)


def same_deployment(store: SQLAlchemyStore) -> PlaceCheck:
    """``agboss migrate --same-deployment``: this store replaces the original (a restore,
    a move), so where it is now becomes the place of its id. Returns the check before."""
    with translated(), store.engine.begin() as conn:
        return record_place(conn, replace=True)


def new_deployment_id(store: SQLAlchemyStore, *, actor: str) -> tuple[str, str]:
    """Give the store a fresh deployment id (old, new), recorded at where it is now; what a
    copy running beside its original on one gateway account needs.

    Refused (``OperatorRefusedError``, code ``in-flight``) while any execution is not
    terminal or any intent is pending: their keys would change, and a redelivery would
    send the payment again under the new key. The check and the write are one transaction
    (SQLite's write lock; on PostgreSQL the keyed tables locked SHARE first), so nothing
    can start between them. Workers keep the id they read at start: stop them first."""
    minted = "".join(secrets.choice(_ALPHABET) for _ in range(_LENGTH))
    with translated(), store.transaction() as tx:
        conn = tx.connection
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(
                "LOCK TABLE agboss_executions, agboss_outbound_calls IN SHARE MODE"
            )
        in_flight = _in_flight(conn)
        if in_flight:
            raise OperatorRefusedError(
                f"the deployment id was not changed: {in_flight}. Changing it changes the "
                "idempotency key of every call in flight, and a redelivery would send the "
                "payment again. Let them finish (or cancel them: `celery -A proj agboss "
                "pending`), then run this again.",
                code="in-flight",
            )
        old = check_place(conn).deployment_id
        if old is None:
            raise StoreNotMigratedError(
                "the store holds no deployment id: run `celery -A proj agboss migrate` first"
            )
        _write_meta(conn, TENANT_META_KEY, minted, insert=False)
        record_place(conn, replace=True)
        insert_audit_txn(
            tx,
            actor=actor,
            action=_ACTION,
            target=TENANT_META_KEY,
            reason="a new deployment id for a copied store",
            before=old,
            after=minted,
        )
    return old, minted


def _in_flight(conn: Connection) -> str:
    """What would change keys under a new id, said for an operator ('' when nothing)."""
    terminal = [state.value for state in TERMINAL_STATES]
    running = [
        str(row.id)
        for row in conn.execute(
            select(executions.c.id).where(executions.c.state.not_in(terminal)).limit(_SHOWN + 1)
        )
    ]
    pending = conn.execute(
        select(func.count()).select_from(outbound_calls).where(outbound_calls.c.status == "PENDING")
    ).scalar_one()
    parts = []
    if running:
        more = "" if len(running) <= _SHOWN else ", …"
        parts.append(f"executions not finished: {', '.join(running[:_SHOWN])}{more}")
    if pending:
        parts.append(f"{pending} intent(s) pending")
    return "; ".join(parts)


def _warn_if_copy(found: dict[str, str], conn: Connection) -> None:
    check = PlaceCheck(found.get(TENANT_META_KEY), found[PLACE_META_KEY], current_place(conn))
    if check.is_copy:
        logger.warning("celery_agboss: %s", check.copy_warning())


__all__ = [
    "PLACE_META_KEY",
    "TENANT_META_KEY",
    "PlaceCheck",
    "check_place",
    "current_place",
    "new_deployment_id",
    "read_store_meta",
    "read_store_tenant",
    "record_place",
    "same_deployment",
    "same_place",
    "shown_place",
]
