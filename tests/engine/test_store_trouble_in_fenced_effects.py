"""The database's own trouble inside a fenced effect's ``fn`` is the store's, not the
application's (design: fenced effect).

A full disk, an I/O error, a deadlock the server broke: nothing of the transaction
committed and a retry may go through, so the delivery stops and is retried (a store
signal). Were it the application's exception, the body's failure would end the execution
``FAILED`` and run its undos: a charge that went through refunded over a disk that filled
for a moment. The application's own errors (a constraint) stay its own.
"""

from __future__ import annotations

from typing import Any

import psycopg.errors
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from celery_agboss.errors import StoreError, StoreLockTimeoutError, StoreUnavailableError
from celery_agboss.store.driver_errors import translate
from tests.engine.app_tables import accounts, create_app_tables, debit, open_account
from tests.engine.helpers import Shop

sqlite_only = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


@sqlite_only
def test_a_full_disk_inside_a_fenced_effect_stops_the_delivery_and_never_fails_it(
    shop: Shop,
) -> None:
    create_app_tables(shop.store.engine)
    charge = shop.charge_call()
    limited: list[Any] = []

    def record(conn: Connection) -> None:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
        conn.exec_driver_sql(f"PRAGMA max_page_count = {pages}")  # the disk is now full
        limited.append(conn.connection.driver_connection)
        conn.execute(text("INSERT INTO shop_ledger (note) VALUES (:n)"), {"n": "x" * 200_000})

    try:
        with shop.start("task-full") as ctx:
            ctx.outbound(charge, {"amount": 1000}, business_key="order:1")
            with pytest.raises(StoreUnavailableError, match="full"):
                ctx.fenced_effect("record", record)
    finally:
        for raw in limited:
            raw.execute("PRAGMA max_page_count = 1073741823")
    assert len(shop.gateway.payments) == 1


@sqlite_only
def test_the_application_s_own_constraint_stays_its_own(shop: Shop) -> None:
    engine = shop.store.engine
    create_app_tables(engine)
    open_account(engine, accounts, 1, 500)
    with shop.start("task-overdraw") as ctx, pytest.raises(IntegrityError):
        ctx.fenced_effect("draw", lambda c: debit(c, accounts, 1, 1000))


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (psycopg.errors.DiskFull, StoreUnavailableError),
        (psycopg.errors.OutOfMemory, StoreUnavailableError),
        (psycopg.errors.IoError, StoreUnavailableError),
        (psycopg.errors.DataCorrupted, StoreUnavailableError),
        (psycopg.errors.DeadlockDetected, StoreLockTimeoutError),
        (psycopg.errors.SerializationFailure, StoreLockTimeoutError),
        (psycopg.errors.LockNotAvailable, StoreLockTimeoutError),
    ],
)
def test_postgresql_s_own_trouble_is_the_store_s(
    error: type[psycopg.Error], kind: type[StoreError]
) -> None:
    assert type(translate(error("from the server"))) is kind


def test_a_constraint_on_postgresql_is_not_the_store_s_trouble() -> None:
    translated = translate(psycopg.errors.UniqueViolation("duplicate key"))
    assert not isinstance(translated, StoreUnavailableError)
