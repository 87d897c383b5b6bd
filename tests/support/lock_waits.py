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


def sent_statements(engine: Engine, act: Callable[[], Any]) -> list[tuple[str, bool]]:
    """The statements ``act()`` sent through ``engine``, each with whether it was its
    own transaction (sent in autocommit)."""
    sent: list[tuple[str, bool]] = []

    def seen(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        sent.append((statement, bool(getattr(cursor.connection, "autocommit", False))))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        act()
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    return sent


def statements_of(engine: Engine, act: Callable[[], Any]) -> list[str]:
    """The statements ``act()`` sent through ``engine``."""
    return [statement for statement, _ in sent_statements(engine, act)]


def at_once(act: Callable[..., Any], *args: Any, times: int = 2) -> list[Any]:
    """``act(*args)`` run ``times`` at once from threads behind a barrier: what each
    returned or raised, in the order they ended."""
    barrier = threading.Barrier(times, timeout=10)
    outcomes: list[Any] = []

    def run() -> None:
        try:
            barrier.wait()
            outcomes.append(act(*args))
        except BaseException as exc:  # handed to the test
            outcomes.append(exc)

    threads = [threading.Thread(target=run, name="at-once", daemon=True) for _ in range(times)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads), "a call never returned"
    return outcomes


__all__ = ["at_once", "during_a_change", "sent_statements", "statements_of", "waiting_backends"]


def in_thread(call: Callable[[], Any], outcome: dict[str, Any], name: str) -> threading.Thread:
    """Run ``call`` in a daemon thread named ``name``: what it returned or raised lands in
    ``outcome[name]``, for the test to judge once it joined."""

    def run() -> None:
        try:
            outcome[name] = call()
        except BaseException as exc:  # judged by the test
            outcome[name] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
