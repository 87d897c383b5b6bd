"""A gevent or eventlet pool on the SQLite store is refused at worker start.

SQLite waits for its write lock inside C, where no greenlet switch happens: one
delivery waiting there froze the whole worker for the 30 s busy timeout (renewals
included), and its executions were taken over again and again towards PARKED (found on
a real ``celery worker -P gevent``). PostgreSQL's driver yields, and starts.

The worker is Celery's own ``WorkController``, made in this process: its ``worker_init``
runs before the pool is loaded, so gevent need not be installed to be refused.
"""

from __future__ import annotations

import pytest

from tests.delivery.conftest import PaymentShop


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_a_green_pool_starts_only_on_postgresql(shop: PaymentShop, pool: str) -> None:
    sqlite = shop.agboss.store.dialect_name == "sqlite"
    if sqlite:
        with pytest.raises(SystemExit, match="refuses to start this worker: a gevent or eventl"):
            shop.app.WorkController(pool_cls=pool, concurrency=2)
        return
    try:
        shop.app.WorkController(pool_cls=pool, concurrency=2)
    except SystemExit as refused:  # pragma: no cover - the failure's message
        raise AssertionError(f"refused on PostgreSQL: {refused}") from None
    except ImportError:
        pass  # gevent/eventlet not installed: loaded only after worker_init, which passed
