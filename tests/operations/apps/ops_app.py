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

CONFIG_ENV = "AGBOSS_OPS_CONFIG"


def _no_send(call: CallContext) -> Any:
    raise RuntimeError("this process never sends")


def _no_lookup(call: CallContext, lookup: Lookup) -> Any:
    return Unknown("no gateway in this process")


def make_app(config: dict[str, Any]) -> Celery:
    app = Celery("ops_cli", broker=config.get("broker_url", "memory://"))
    app.conf.update(
        task_default_queue="ops",
        agboss_database_url=config["database_url"],
        agboss_pseudonym_key="operations-tests-pseudonym-key",
        agboss_lease_ttl=5,
        agboss_requested_grace=60,
        agboss_sweep_interval=30,
        agboss_max_recovery_attempts=3,
        agboss_attempt_timeout=10,
    )
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
