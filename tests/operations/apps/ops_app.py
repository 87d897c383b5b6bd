"""The operations tests' app, for ``celery -A tests.operations.apps.ops_app:app agboss …``
subprocesses: the same settings, task and call names as ``tests.operations.world``.

Configured from ``AGBOSS_OPS_CONFIG`` (JSON): ``database_url``, ``clock_offset_ms`` (the
test's virtual database clock, so both processes agree on time) and any ``agboss_*``.
Its call has no gateway: reconcile answers ``Unknown``.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_agboss import AGBoss, OutboundCall, PaymentTask, Unknown
from celery_agboss.core.outbound import CallContext, Lookup
from tests.operations.world import OPS_SETTINGS

CONFIG_ENV = "AGBOSS_OPS_CONFIG"


def _no_send(call: CallContext) -> Any:
    raise RuntimeError("this process never sends")


def _no_lookup(call: CallContext, lookup: Lookup) -> Any:
    return Unknown("no gateway in this process")


def make_app(config: dict[str, Any]) -> Celery:
    app = Celery("ops_cli", broker=config.get("broker_url", "memory://"))
    app.conf.update(OPS_SETTINGS, agboss_database_url=config["database_url"])
    app.conf.update(config.get("conf", {}))
    agboss = AGBoss(app)
    offset = int(config.get("clock_offset_ms", 0))
    agboss.clock_offset_source = lambda: offset
    call = OutboundCall(
        name="ops.charge", send=_no_send, reconcile=_no_lookup, key_retention=timedelta(hours=24)
    )
    agboss.register(call)

    @app.task(base=PaymentTask, bind=True, shared=False, name="ops.charge_order")
    def charge_order(self: Any, order: str) -> Any:
        return self.outbound(call, {"amount": 1000, "order": order}, business_key=f"order:{order}")

    return app


_raw = os.environ.get(CONFIG_ENV)
app = make_app(json.loads(_raw)) if _raw else None
