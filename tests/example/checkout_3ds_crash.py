"""``python -m tests.example.checkout_3ds_crash DIR``: the shop's ``checkout_3ds`` as written,
killed right after its capture, then run again; what happened, as JSON on stdout.

Run in a process of its own (by ``test_checkout_3ds_rerun.py``): ``example_project.shop``
reads its settings from the environment when it is imported and makes its Celery app
the process's current one, which no other test's process should inherit.

The shop's app is bound to a throwaway SQLite store in ``DIR`` and the in-memory broker
(``bound_app``), its Stripe SDK pointed at ``FakeGatewayServer``'s Stripe dialect. Each
delivery runs in this thread (``apply``): the authorisation, then the pause; the return
page's answer; the delivery that captures and dies before it records the capture's
answer (``Crash``, a ``BaseException`` raised at the fault point after the send: the
lease is left as a SIGKILL leaves it); the lease's expiry; the re-run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.dialects.stripe import StripeDialect
from celery_agboss.testing.fault_arming import OUTBOUND_AFTER_SEND, arm_raise
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer

ORDER_ID = "3ds-1"


class Crash(BaseException):
    """The delivery died here: nothing after this point runs, its lease is not released."""


def run(data_dir: Path) -> dict[str, Any]:
    gateway = FakeGateway(capabilities=StripeDialect.documented_capabilities)
    with FakeGatewayServer(gateway, dialect=StripeDialect()) as server:
        os.environ.update(
            EXAMPLE_DATA_DIR=str(data_dir),
            AGBOSS_DATABASE_URL=f"sqlite:///{data_dir / 'shop.db'}",
            CELERY_BROKER_URL="memory://",
            STRIPE_API_BASE=server.url,
        )
        from celery_agboss import AGBoss, answer_pause
        from celery_agboss.testing.celery_app import bound_app
        from example_project import migrate, orders, shop, web

        url = migrate.run()
        clock = VirtualClock()
        with bound_app(shop.app, url, clock_offset_source=clock.offset_ms) as app:
            runtime = AGBoss.of(app)
            task_id = web.task_id_of(ORDER_ID)
            with runtime.store.engine.begin() as conn:
                orders.place(conn, ORDER_ID, 1000)

            shop.checkout_3ds.apply((ORDER_ID,), task_id=task_id)  # authorised, paused
            paused = runtime.executions.read_execution(task_id)
            answer_pause(app, f"{task_id}:3ds", {"source": "return-page"})

            crash = arm_raise(OUTBOUND_AFTER_SEND, Crash, only={"call": shop.stripe.capture.name})
            crashed = False
            try:
                shop.checkout_3ds.apply((ORDER_ID,), task_id=task_id)
            except Crash:
                crashed = True
            clock.advance(runtime.settings.lease_ttl_seconds + 1)  # the dead delivery's lease

            rerun = shop.checkout_3ds.apply((ORDER_ID,), task_id=task_id)
            record = runtime.executions.read_execution(task_id)
            with runtime.store.engine.connect() as conn:
                order = orders.load(conn, ORDER_ID)
                entries = orders.entries(conn, ORDER_ID)
        requests = [(r.operation, r.outcome.value) for r in server.gateway.requests]
    assert paused is not None and record is not None
    return {
        "paused": paused.state.value,
        "crashed": crashed and crash.hits == 1,
        "state": record.state.value,
        "reason": record.reason,
        "rerun_succeeded": rerun.successful(),
        "order_status": order["status"],
        "payment_id": order["payment_id"],
        "marked_paid": sum(1 for entry, _ in entries if entry == "paid"),
        "requests": requests,
    }


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]).resolve())))
