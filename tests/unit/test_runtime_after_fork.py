"""A prefork child never hangs on a lock a thread of its parent held at the fork.

``Runtime._lock`` guards opening the store and reading the settings. A fork copies it
held when another thread of the parent holds it, but not that thread: the child's
``worker_process_init`` (``Runtime.after_fork``) then waits on it for ever, and the
pool never gets that child. The lock is made anew in every forked child (as
``core.lease`` does for its own), and the tenant's database read no longer holds it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_agboss import AGBoss
from celery_agboss.runtime.settings import AGBossSettings
from celery_agboss.signals import disconnect

KEY = "a-pseudonym-key-of-enough-bytes"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[AGBoss]:
    """An app bound to AGBoss on a SQLite store; disconnected and closed afterwards."""
    app = Celery("after-fork", broker="memory://", set_as_current=False)
    app.conf.update(
        agboss_database_url=f"sqlite:///{tmp_path / 'agboss.db'}", agboss_pseudonym_key=KEY
    )
    bound = AGBoss(app)
    yield bound
    disconnect(bound)
    bound.close()
    app.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_child_forked_while_a_thread_holds_the_lock_gets_past_worker_process_init(
    runtime: AGBoss,
) -> None:
    runtime.store  # noqa: B018 - opened in the parent, as worker_init does
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with runtime._lock:  # e.g. another thread opening the store, or reading settings
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: what worker_process_init runs, in its only thread
        signal.signal(signal.SIGALRM, lambda *_: os._exit(1))
        signal.alarm(3)
        runtime.after_fork()
        runtime.store  # noqa: B018 - and it opens its own store
        os._exit(0)
    release.set()
    holder.join(5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child hung in Runtime.after_fork"


def test_reading_the_tenant_from_the_store_does_not_hold_the_lock(
    runtime: AGBoss, monkeypatch: pytest.MonkeyPatch
) -> None:
    """engine_settings held the lock across the tenant's query: a slow store kept every
    other thread (and any child forked meanwhile) waiting on it."""
    reading, answer = threading.Event(), threading.Event()

    def slow_tenant(settings: AGBossSettings) -> str:
        reading.set()
        answer.wait(10)
        return "shop"

    monkeypatch.setattr(runtime, "_store_tenant", slow_tenant)
    reader = threading.Thread(target=lambda: runtime.engine_settings, daemon=True)
    reader.start()
    try:
        assert reading.wait(5)
        acquired = runtime._lock.acquire(timeout=2)
        assert acquired, "the tenant's read holds the runtime's lock"
        runtime._lock.release()
    finally:
        answer.set()
        reader.join(5)
    assert runtime.tenant == "shop"
