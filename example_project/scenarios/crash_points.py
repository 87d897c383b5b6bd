"""Where a scenario stops a worker: at a write to the shop's orders, read from a control file.

A scenario needs a worker to die or freeze at one exact point — after the charge and
before the order is marked paid, right after that write committed — which no signal sent
from outside can hit. So the scenario runner writes the point into
``$EXAMPLE_DATA_DIR/crash-points.json``; a worker process that reaches it (an SQLAlchemy
event on every engine, so the protected and the plain tasks alike) writes its pid to
``frozen/`` and stops itself with SIGSTOP. The runner then does to that pid what the
scenario says: SIGKILL (a crash), or SIGCONT later (a zombie waking up). Nothing in the
shop's code knows about it; only the demo's worker app installs it.

Points: ``before-mark-paid`` (the UPDATE that marks the order paid is about to run),
``after-mark-paid`` (its transaction just committed), ``lose-commit-answer`` (the same
commit went in, then the worker is told the connection was lost: PS14, simulated on
SQLite, which has no connection to cut).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

CONTROL_FILE = "crash-points.json"
FROZEN_DIR = "frozen"
POINTS = ("before-mark-paid", "after-mark-paid", "lose-commit-answer")


class _LostCommitAnswer(Exception):
    """What the driver would raise when the answer to a COMMIT never came."""


def _data_dir() -> Path:
    from example_project import config

    return config.data_dir()


def arm(data_dir: Path, point: str, order_id: str, *, times: int = 1) -> None:
    """Make the next ``times`` workers that reach ``point`` for ``order_id`` stop there."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; one of {', '.join(POINTS)}")
    with _locked(data_dir) as points:
        points.append({"point": point, "order": order_id, "times": times})


def frozen(data_dir: Path, point: str, order_id: str) -> list[int]:
    """The pids that stopped at ``point`` for ``order_id``, in the order they stopped."""
    folder = data_dir / FROZEN_DIR
    found = sorted(folder.glob(f"{point}--{order_id}--*.json")) if folder.exists() else []
    return [int(json.loads(path.read_text())["pid"]) for path in found]


class _locked:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / CONTROL_FILE
        self.handle: Any = None
        self.points: list[dict[str, Any]] = []

    def __enter__(self) -> list[dict[str, Any]]:
        self.handle = open(self.path, "a+")
        fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX)
        self.handle.seek(0)
        raw = self.handle.read()
        self.points = json.loads(raw) if raw.strip() else []
        return self.points

    def __exit__(self, *exc: object) -> None:
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(json.dumps(self.points))
        self.handle.flush()
        fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
        self.handle.close()


def _take(point: str, text: str) -> str | None:
    """The armed order this statement is about, consumed; None when nothing is armed."""
    path = _data_dir() / CONTROL_FILE
    if not path.exists() or path.stat().st_size == 0:
        return None
    with _locked(_data_dir()) as points:
        for armed in points:
            if armed["point"] == point and armed["times"] > 0 and armed["order"] in text:
                armed["times"] -= 1
                return str(armed["order"])
    return None


def _stop_here(point: str, order_id: str) -> None:
    folder = _data_dir() / FROZEN_DIR
    folder.mkdir(exist_ok=True)
    stamp = f"{time.time():.6f}"
    record = {"pid": os.getpid(), "point": point, "order": order_id}
    (folder / f"{point}--{order_id}--{stamp}.json").write_text(json.dumps(record))
    os.kill(os.getpid(), signal.SIGSTOP)  # the runner kills or continues this pid


def _marks_paid(statement: str, parameters: Any) -> bool:
    return statement.lstrip().upper().startswith("UPDATE SHOP_ORDERS") and "paid" in repr(
        parameters
    )


_AFTER_COMMIT: dict[int, list[tuple[str, str]]] = {}
_PATCHED: set[type] = set()


def _before_execute(
    conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
) -> None:
    if not _marks_paid(statement, parameters):
        return
    text = repr(parameters)
    order = _take("before-mark-paid", text)
    if order is not None:
        _stop_here("before-mark-paid", order)
    for point in ("after-mark-paid", "lose-commit-answer"):
        order = _take(point, text)
        if order is not None:
            _patch_commit(type(conn.dialect))
            # do_commit gets the pool's proxy of the DBAPI connection: key by that.
            _AFTER_COMMIT.setdefault(id(conn.connection), []).append((point, order))


def _patch_commit(dialect_class: type) -> None:
    """SQLAlchemy's ``commit`` event fires before the COMMIT; these points come after it."""
    if dialect_class in _PATCHED:
        return
    _PATCHED.add(dialect_class)
    commit, rollback = dialect_class.do_commit, dialect_class.do_rollback  # type: ignore[attr-defined]

    def do_commit(self: Any, dbapi_connection: Any) -> None:
        commit(self, dbapi_connection)
        for point, order in _AFTER_COMMIT.pop(id(dbapi_connection), []):
            if point == "after-mark-paid":
                _stop_here(point, order)
            else:
                raise OperationalError("COMMIT", {}, _LostCommitAnswer("the connection was lost"))

    def do_rollback(self: Any, dbapi_connection: Any) -> None:
        _AFTER_COMMIT.pop(id(dbapi_connection), None)
        rollback(self, dbapi_connection)

    dialect_class.do_commit = do_commit  # type: ignore[attr-defined]
    dialect_class.do_rollback = do_rollback  # type: ignore[attr-defined]


def install() -> None:
    """Listen on every engine of this process (idempotent)."""
    if not event.contains(Engine, "before_cursor_execute", _before_execute):
        event.listen(Engine, "before_cursor_execute", _before_execute)
