"""The shop's own tables, in the store's database: orders, stock, and a ledger of what happened.

The ledger is how the scenarios see a duplicate the gateway cannot show: an order marked
paid twice, a receipt sent twice, a webhook applied twice. Every write here takes a
connection, so a task runs it inside ``self.fenced_effect`` (in the effect's transaction)
and the unprotected twin runs it in a transaction of its own.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    insert,
    select,
    update,
)

metadata = MetaData()

orders = Table(
    "shop_orders",
    metadata,
    Column("id", String(80), primary_key=True),
    Column("amount", Integer, nullable=False),
    Column("currency", String(3), nullable=False),
    Column("card", String(80), nullable=False),
    Column("sku", String(40), nullable=False),
    Column("status", String(20), nullable=False),
    Column("payment_id", String(80)),
    Column("attempt", Integer, nullable=False),
    Column("placed_at", Float, nullable=False),  # epoch seconds, the placing host's clock
)

stock = Table(
    "shop_stock",
    metadata,
    Column("sku", String(40), primary_key=True),
    Column("quantity", Integer, nullable=False),
)

ledger = Table(
    "shop_ledger",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", String(80), nullable=False, index=True),
    Column("entry", String(60), nullable=False),
    Column("reference", String(120)),
)

# An order's status only moves forward (design: PS16): a late or out-of-order event can never
# take a refunded order back to paid.
PROGRESS = {"new": 0, "authorized": 1, "paid": 2, "captured": 2, "voided": 3, "refunded": 3}
DEFAULT_CARD = "pm_card_visa"


def create_tables(url_or_engine: str | Engine) -> None:
    engine = _engine(url_or_engine)
    metadata.create_all(engine)


def _engine(url_or_engine: str | Engine) -> Engine:
    return create_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine


def place(
    conn: Connection,
    order_id: str,
    amount: int,
    *,
    currency: str = "usd",
    card: str = DEFAULT_CARD,
    sku: str = "mug",
) -> None:
    conn.execute(
        insert(orders).values(
            id=order_id,
            amount=amount,
            currency=currency,
            card=card,
            sku=sku,
            status="new",
            attempt=1,
            placed_at=time.time(),
        )
    )


def load(conn: Connection, order_id: str) -> dict[str, Any]:
    row = conn.execute(select(orders).where(orders.c.id == order_id)).mappings().first()
    if row is None:
        raise LookupError(f"no order {order_id!r}")
    return dict(row)


def note(conn: Connection, order_id: str, entry: str, reference: str | None = None) -> int:
    """Append to the ledger; the entry's number."""
    conn.execute(insert(ledger).values(order_id=order_id, entry=entry, reference=reference))
    count = conn.execute(
        select(func.count())
        .select_from(ledger)
        .where(ledger.c.order_id == order_id, ledger.c.entry == entry)
    ).scalar_one()
    return int(count)


def move(conn: Connection, order_id: str, status: str, payment_id: str | None = None) -> bool:
    """Move the order to ``status`` if that is forward; True when it moved."""
    current = load(conn, order_id)["status"]
    if PROGRESS[status] <= PROGRESS[current]:
        return False
    values: dict[str, Any] = {"status": status}
    if payment_id is not None:
        values["payment_id"] = payment_id
    conn.execute(update(orders).where(orders.c.id == order_id).values(**values))
    return True


def mark_paid(conn: Connection, order_id: str, payment_id: str) -> None:
    """The order is paid by ``payment_id``, forward only (``move``): a charge whose answer
    is written late (its worker died, the webhook paid the order, the customer was
    refunded since) never moves a ``refunded`` order back to ``paid``, to be shipped.
    Every call is one ledger line, so a second payment still shows."""
    move(conn, order_id, "paid", payment_id)
    note(conn, order_id, "paid", payment_id)


def keep_payment(conn: Connection, order_id: str, payment_id: str) -> None:
    """Keep the order's PaymentIntent before it took or holds anything (an authorisation
    awaiting 3-D Secure): its status stays, and a PaymentIntent kept before stays."""
    conn.execute(
        update(orders)
        .where(orders.c.id == order_id, orders.c.payment_id.is_(None))
        .values(payment_id=payment_id)
    )


def next_attempt(conn: Connection, order_id: str) -> int:
    """Number the next payment attempt on the order row (design: PS22)."""
    attempt = int(load(conn, order_id)["attempt"]) + 1
    conn.execute(update(orders).where(orders.c.id == order_id).values(attempt=attempt))
    return attempt


def set_card(conn: Connection, order_id: str, card: str) -> None:
    conn.execute(update(orders).where(orders.c.id == order_id).values(card=card))


def stock_up(conn: Connection, sku: str, quantity: int) -> None:
    found = conn.execute(select(stock.c.quantity).where(stock.c.sku == sku)).first()
    if found is None:
        conn.execute(insert(stock).values(sku=sku, quantity=quantity))
    else:
        conn.execute(update(stock).where(stock.c.sku == sku).values(quantity=quantity))


class OutOfStock(Exception):
    """Nothing left to ship: a real failure of the order, after it was charged."""


def reserve(conn: Connection, order_id: str, sku: str) -> None:
    left = conn.execute(select(stock.c.quantity).where(stock.c.sku == sku)).scalar()
    if not left:
        raise OutOfStock(f"order {order_id}: no {sku!r} left")
    conn.execute(update(stock).where(stock.c.sku == sku).values(quantity=int(left) - 1))
    note(conn, order_id, "reserved", sku)


def entries(conn: Connection, order_id: str) -> list[tuple[str, str | None]]:
    rows = conn.execute(
        select(ledger.c.entry, ledger.c.reference)
        .where(ledger.c.order_id == order_id)
        .order_by(ledger.c.id)
    )
    return [(str(entry), reference) for entry, reference in rows]
