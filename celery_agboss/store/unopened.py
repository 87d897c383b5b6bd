"""What an operator is shown of a row one of whose values no key of this process opens:
a key dropped before ``agboss rotate-keys`` reached the row, or a new first key a
worker sealed with and this process was not given yet (design: sealed at rest).

A listing for a person never stops on such a row, nor leaves it out: the operator needs
exactly that row. Every value that opens is shown; each one that does not reads as the
text ``unopened_text`` makes, naming the key that sealed it, never as empty. Only what
is shown is read so (``showing_unopened``): a verb re-reads its row under its lock, and
meets the error there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Connection

from celery_agboss.core.sealing import KeyRing, SealedAt, Sealer
from celery_agboss.errors import SealedValueUnopenableError
from celery_agboss.store.codec import dumps
from celery_agboss.store.sealed_columns import SEALED_COLUMNS, sealer_of

UNOPENED_START = "[sealed under key "
"""How a value this process could not open begins, where a listing shows it."""

_DECODED_AS_JSON = {
    "agboss_outbound_calls": frozenset({"request", "result", "failure"}),
    "agboss_intent_history": frozenset({"detail"}),
}
"""The sealed columns their readers decode as JSON: the text stands there as a JSON
string, so the reader gives it back as it is."""


def unopened_text(error: SealedValueUnopenableError, ring: KeyRing | None) -> str:
    """What stands in a listing for a value ``error`` says did not open."""
    key_id = str(getattr(error, "key_id", "?"))
    why = (
        "which does not open it (moved from another row, or altered)"
        if ring is not None and key_id in ring.key_ids
        else "not held by this process"
    )
    return f"{UNOPENED_START}{key_id!r}, {why}]"


def unopened_fields(record: object, table: str) -> dict[str, str]:
    """The sealed fields of ``record`` (a row of ``table``) a listing could not open,
    each with the text that says so; empty when every one opened."""
    found: dict[str, str] = {}
    for name in SEALED_COLUMNS[table][1]:
        value = getattr(record, name, None)
        if isinstance(value, str) and value.startswith(UNOPENED_START):
            found[name] = value
    return found


class _Showing(Sealer):
    """Opens as ``base`` does; a value it cannot open reads as ``unopened_text``."""

    def __init__(self, base: Sealer) -> None:
        super().__init__(base.ring, store_sealed=base.store_sealed)

    def open(self, stored: str | None, where: SealedAt) -> str | None:
        try:
            return super().open(stored, where)
        except SealedValueUnopenableError as error:
            text = unopened_text(error, self.ring)
            return dumps(text) if where.column in _DECODED_AS_JSON.get(where.table, ()) else text


@contextmanager
def showing_unopened(conn: Connection) -> Iterator[None]:
    """Within it, the records read on ``conn`` are for a person to look at: a value no key
    of this process opens reads as ``unopened_text``. Nothing may decide on them."""
    had = "agboss_sealer" in vars(conn)
    previous = getattr(conn, "agboss_sealer", None)
    setattr(conn, "agboss_sealer", _Showing(sealer_of(conn)))  # noqa: B010 - a Connection's
    try:
        yield
    finally:
        if had:
            setattr(conn, "agboss_sealer", previous)  # noqa: B010
        else:
            delattr(conn, "agboss_sealer")


__all__ = ["UNOPENED_START", "showing_unopened", "unopened_fields", "unopened_text"]
