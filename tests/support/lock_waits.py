"""A store call sent while another PostgreSQL transaction holds the row it needs.

The one-statement tests need the statement to wait for a row lock and then see what
the other transaction committed: the row is changed (not committed) on a connection of
its own, the call runs in a thread, and once the server shows a backend waiting for a
lock the change commits. What the call returned or raised is handed back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from tests.support.processes import wait_until


def waiting_backends(engine: Engine) -> int:
    """Backends of the engine's database waiting for a lock now."""
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
        ).scalar_one()
    return int(found)


def during_a_change(
    engine: Engine,
    change: str,
    parameters: Mapping[str, Any],
    call: Callable[[], Any],
    *,
    commit_when: Callable[[], bool] | None = None,
) -> Any:
    """``call()``'s result (or the exception it raised), sent while ``change`` holds its
    rows uncommitted; the change commits once the call waits for them (and, with
    ``commit_when``, once that also holds)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    with engine.connect() as other:
        other.execute(text(change), dict(parameters))
        caller = threading.Thread(target=run, name="waits-for-a-row", daemon=True)
        caller.start()
        wait_until(lambda: waiting_backends(engine) >= 1, 10, message="the call's lock wait")
        if commit_when is not None:
            wait_until(commit_when, 10, message="the moment to end the change")
        other.commit()
    caller.join(10)
    assert not caller.is_alive(), "the call never returned"
    return outcome[0]


def statements_of(engine: Engine, act: Callable[[], Any]) -> list[str]:
    """The statements ``act()`` sent through ``engine``."""
    sent: list[str] = []

    def count(*args: Any) -> None:
        sent.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", count)
    try:
        act()
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return sent


__all__ = ["during_a_change", "statements_of", "waiting_backends"]
