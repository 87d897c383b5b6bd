"""A state a newer version of the package may write, put in a row as that version would."""

from __future__ import annotations

from sqlalchemy import Engine, text

FUTURE_STATE = "SOME_FUTURE_STATE"
"""A state a newer version of the package may write; this one does not know it."""


def write_raw_state(engine: Engine, execution_id: str, state: str = FUTURE_STATE) -> None:
    """Write ``state`` into the execution's row by raw SQL, as a newer version's worker
    would (no code of this version could)."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE agboss_executions SET state = :state WHERE id = :id"),
            {"state": state, "id": execution_id},
        )
