"""No SQLite write transaction open across a fork.

SQLite keeps a process's view of the database file's locks in that process's memory. A
child forked while one of its parent's threads holds the write lock inherits that view:
its own new connection then finds the write lock taken by a connection of "its" process
that does not exist in it, and waits out its whole busy timeout — every time, although
the parent committed long ago (SQLite's "do not carry an open connection across a
fork"). A prefork worker's main process writes to the store (renewals, its own sweeps)
and forks a new pool process whenever one dies, so a child forked at the wrong moment
could not write for 30 s (``StoreLockTimeoutError``).

So every SQLite engine of the store marks a connection when it begins a write
transaction and unmarks it when the connection goes back to the pool; a fork waits
(bounded) until no connection of this process is marked, and holds new write
transactions back until it is done. The child starts with no mark.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from celery_agboss.core import sabotage
from celery_agboss.core.protections import SQLITE_FORK_UNGUARDED

FORK_WAIT_SECONDS = 5.0
"""How long a fork waits for the write transactions in flight: a fenced one holds the
lock at most a quarter of its lease. Past it the fork goes ahead (as it did before)."""

_MARK = "agboss_sqlite_writing"


class ForkGuard:
    """Counts this process's SQLite write transactions; a fork waits for none."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._writing = 0
        self._forking = False

    def begin_write(self, info: dict[str, Any]) -> None:
        if info.get(_MARK):
            return
        with self._changed:
            while self._forking:
                self._changed.wait()
            self._writing += 1
        info[_MARK] = True

    def end_write(self, info: dict[str, Any]) -> None:
        if not info.pop(_MARK, False):
            return
        with self._changed:
            self._writing -= 1
            self._changed.notify_all()

    def before_fork(self) -> None:
        self._changed.acquire()
        if sabotage.active(SQLITE_FORK_UNGUARDED):
            return
        self._forking = True
        deadline = time.monotonic() + FORK_WAIT_SECONDS
        while self._writing > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.wait(left)

    def after_fork_in_parent(self) -> None:
        self._forking = False
        self._changed.notify_all()
        self._changed.release()

    def after_fork_in_child(self) -> None:
        # The parent's transactions are not this process's; the lock was held at fork.
        self._changed = threading.Condition(threading.Lock())
        self._writing = 0
        self._forking = False


GUARD = ForkGuard()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=GUARD.before_fork,
        after_in_parent=GUARD.after_fork_in_parent,
        after_in_child=GUARD.after_fork_in_child,
    )
