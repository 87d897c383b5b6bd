"""The application's own tables in the store's database, for fenced-effect tests.

A fenced effect's ``fn`` writes the application's rows in the store's transaction,
so the harm a test counts (a row written twice, a balance overdrawn) is counted
here, in the application's tables — never in ``agboss_*`` ones.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CheckConstraint,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine

app_metadata = MetaData()

ledger = Table(
    "shop_ledger",
    app_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("note", String(200), nullable=False),
)

accounts = Table(
    "shop_accounts",
    app_metadata,
    Column("id", Integer, primary_key=True),
    Column("balance", Integer, nullable=False),
    CheckConstraint("balance >= 0", name="shop_balance_never_negative"),
)

loose_accounts = Table(  # the same without the invariant: the PS9 "wrong" twin
    "shop_loose_accounts",
    app_metadata,
    Column("id", Integer, primary_key=True),
    Column("balance", Integer, nullable=False),
)

capture_numbers = Table(
    "shop_capture_numbers",
    app_metadata,
    Column("authorization", String(100), primary_key=True),
    Column("last", Integer, nullable=False),
)


def create_app_tables(engine: Engine) -> None:
    app_metadata.create_all(engine)


def write_note(conn: Connection, note: str) -> dict[str, Any]:
    conn.execute(insert(ledger).values(note=note))
    return {"note": note}


def notes(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [row.note for row in conn.execute(select(ledger.c.note).order_by(ledger.c.id))]


def open_account(engine: Engine, table: Table, account_id: int, balance: int) -> None:
    with engine.begin() as conn:
        conn.execute(insert(table).values(id=account_id, balance=balance))


def debit(conn: Connection, table: Table, account_id: int, amount: int) -> dict[str, Any]:
    conn.execute(
        update(table).where(table.c.id == account_id).values(balance=table.c.balance - amount)
    )
    return {"debited": amount}


def balance(engine: Engine, table: Table, account_id: int) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(select(table.c.balance).where(table.c.id == account_id)).scalar_one()
        )


def next_capture_number(conn: Connection, authorization: str) -> int:
    """The application's ledger numbers captures: n for ``capture:<authorization>:<n>``."""
    current = conn.execute(
        select(capture_numbers.c.last).where(capture_numbers.c.authorization == authorization)
    ).scalar()
    if current is None:
        conn.execute(insert(capture_numbers).values(authorization=authorization, last=1))
        return 1
    conn.execute(
        update(capture_numbers)
        .where(capture_numbers.c.authorization == authorization)
        .values(last=capture_numbers.c.last + 1)
    )
    return int(current) + 1


def count(engine: Engine, table: Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())
