"""``python -m tests.example.checkout_3ds_crash DIR``: the shop's ``checkout_3ds`` as written,
killed right after its capture, then run again; what happened, as JSON on stdout.

Run in a process of its own (by ``test_checkout_3ds_rerun.py``): ``example_project.shop``
reads its settings from the environment when it is imported and makes its Celery app
the process's current one, which no other test's process should inherit.

The shop's app is bound to a throwaway SQLite store in ``DIR`` and the in-memory broker,
its Stripe SDK pointed at ``FakeGatewayServer``'s Stripe dialect (``shop_on_fake_stripe``). Each
delivery runs in this thread (``apply``): the authorisation, then the pause; the return
page's answer; the delivery that captures and dies before it records the capture's
answer (``Crash``, a ``BaseException`` raised at the fault point after the send: the
lease is left as a SIGKILL leaves it); the lease's expiry; the re-run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.fault_arming import OUTBOUND_AFTER_SEND, arm_raise
from tests.example.charge_statuses import shop_on_fake_stripe

ORDER_ID = "3ds-1"


class Crash(BaseException):
    """The delivery died here: nothing after this point runs, its lease is not released."""


def run(data_dir: Path) -> dict[str, Any]:
    clock = VirtualClock()
    url = f"sqlite:///{data_dir / 'shop.db'}"
    with shop_on_fake_stripe(data_dir, url, clock=clock) as world:
        from celery_agboss import answer_pause
        from example_project import orders, shop, web

        task_id = web.task_id_of(ORDER_ID)
        with world.engine.begin() as conn:
            orders.place(conn, ORDER_ID, 1000)

        shop.checkout_3ds.apply((ORDER_ID,), task_id=task_id)  # authorised, paused
        paused = world.runtime.executions.read_execution(task_id)
        answer_pause(world.app, f"{task_id}:3ds", {"source": "return-page"})

        crash = arm_raise(OUTBOUND_AFTER_SEND, Crash, only={"call": shop.stripe.capture.name})
        crashed = False
        try:
            shop.checkout_3ds.apply((ORDER_ID,), task_id=task_id)
        except Crash:
            crashed = True
        clock.advance(world.runtime.settings.lease_ttl_seconds + 1)  # the dead one's lease

        rerun = shop.checkout_3ds.apply((ORDER_ID,), task_id=task_id)
        record = world.runtime.executions.read_execution(task_id)
        with world.engine.connect() as conn:
            order = orders.load(conn, ORDER_ID)
            entries = orders.entries(conn, ORDER_ID)
        requests = [(r.operation, r.outcome.value) for r in world.gateway.requests]
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
