"""A worker's row of held messages goes at a warm stop, after its last write.

``close`` waits a few seconds for the thread; a write slower than that (a lock wait, a
slow database) used to land after ``close`` had deleted the row, so the row stayed, went
stale one TTL later, and the sweep re-published messages the broker already had back.
The thread now deletes the row itself once its last write is done.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.store.held_messages import read_held
from celery_agboss.worker import held_messages
from tests.operations.world import World

DEADLINE_SECONDS = 20.0


def test_a_write_that_outlives_the_shutdown_wait_leaves_no_row_behind(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = Runtime.of(world.app)
    # Speed-up: a heartbeat of 0.1 s instead of a third of the world's lease TTL.
    fast = SimpleNamespace(
        app=runtime.app, store=runtime.store, settings=SimpleNamespace(lease_ttl_seconds=0.3)
    )
    held = held_messages.HeldMessages(fast)  # type: ignore[arg-type]
    monkeypatch.setattr(held_messages, "JOIN_SECONDS", 0.1)
    monkeypatch.setattr(held, "held", lambda: frozenset({"an-unstarted-message"}))
    in_write, release = threading.Event(), threading.Event()
    write = held_messages.write_held

    def slow_write(*args: Any) -> None:
        in_write.set()
        assert release.wait(DEADLINE_SECONDS)
        write(*args)

    monkeypatch.setattr(held_messages, "write_held", slow_write)
    held.thread.start()
    try:
        assert in_write.wait(DEADLINE_SECONDS), "the thread never wrote"
        held.close()  # its wait runs out while the write is under way
    finally:
        release.set()
        held.thread.join(DEADLINE_SECONDS)
    assert not held.thread.is_alive()
    assert [row for row in read_held(runtime.store) if row.worker == held.worker] == []
