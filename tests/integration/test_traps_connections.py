"""Trap 12: connections across fork, and SQLite's write lock, in a real prefork worker.

The prefork pool forks after the app is imported, and here after the worker's main
process has opened a store connection of its own (``connect_before_fork``). Each
pool child must drop the pool it inherited (``worker_process_init``,
``engine.dispose(close=False)``) and open its own: every child writes on its own
PostgreSQL backend, none on the parent's. On SQLite, pysqlite's own transaction
handling is switched off so that ``BEGIN IMMEDIATE`` is what runs: fenced effects
of four processes that read, wait and write one row serialize on the write lock —
no update is lost, and no "database is locked" escapes to a task.

Deployment speed-ups it relies on: the harness's (``-Q``, a 5 s lease, no beat:
tests/integration/harness.py).
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from tests.integration.gateway_http import wait_for
from tests.integration.harness import ShopFactory

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


def test_trap_12_each_prefork_child_writes_on_its_own_postgresql_backend(
    shop_factory: ShopFactory, postgres_database_url: str
) -> None:
    shop = shop_factory(database_url=postgres_database_url, connect_before_fork=True)
    worker = shop.start_worker(concurrency=2)
    parent = wait_for(
        lambda: shop.gateway.notes_of("parent-backend"), 10, "the parent's own connection"
    )
    parent_backend = parent[0].fields["backend"]
    assert parent[0].pid == worker.pid, "the worker's main process connected before forking"
    ids = [
        str(shop.app.signature("it.store_pids", kwargs={"gate_name": f"pids-{n}"}).apply_async().id)
        for n in range(2)
    ]
    # Both children busy at once: each holds one execution at its gate.
    wait_for(
        lambda: all(shop.gateway.gate_waiters(f"pids-{n}") for n in range(2)),
        20,
        "both children at their gates",
    )
    for n in range(2):
        shop.gateway.open_gate(f"pids-{n}")
    for task_id in ids:
        shop.wait_state(task_id, "COMPLETED", timeout=20)
    seen = [shop.app.AsyncResult(task_id).get(timeout=10) for task_id in ids]
    pids = {entry["pid"] for entry in seen}
    backends = {entry["backend"] for entry in seen}
    assert len(pids) == 2 and worker.pid not in pids, "two pool children did the writing"
    assert pids <= set(shop.children(worker))
    assert len(backends) == 2, "each child on a backend of its own"
    assert parent_backend not in backends, "no child inherited the parent's connection"
    log = shop.worker_log()
    for pid in pids:
        assert f"pid={pid}" in log and "store.opened" in log, "each child opened its own store"


def test_trap_12_fenced_writes_of_several_sqlite_processes_serialize(
    shop_factory: ShopFactory, sqlite_database_url: str
) -> None:
    engine = create_engine(sqlite_database_url)
    with engine.begin() as conn:
        conn.execute(text("create table it_counter (id integer primary key, value integer)"))
        conn.execute(text("insert into it_counter (id, value) values (1, 0)"))
    shop = shop_factory(database_url=sqlite_database_url)
    worker = shop.start_worker(concurrency=4)
    tasks, times = 8, 3
    ids = [
        str(shop.app.signature("it.bump_counter", kwargs={"times": times}).apply_async().id)
        for _ in range(tasks)
    ]
    for task_id in ids:
        shop.wait_state(task_id, "COMPLETED", timeout=40)
    with engine.connect() as conn:
        value = conn.execute(text("select value from it_counter where id = 1")).scalar()
    engine.dispose()
    assert value == tasks * times, "no read-modify-write was lost: the writers serialized"
    results = [shop.app.AsyncResult(task_id).get(timeout=10) for task_id in ids]
    bumps = sorted(v for result in results for v in result)
    assert bumps == list(range(1, tasks * times + 1)), "every bump saw the one before it"
    log = shop.worker_log()
    assert "database is locked" not in log
    assert "StoreBusy" not in log and "store-failed" not in log
    assert len(set(shop.children(worker))) == 4, "four processes wrote at once"
