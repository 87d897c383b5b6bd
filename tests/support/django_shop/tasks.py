"""One charge through ``self.outbound``, sent to the test's fake gateway over HTTP."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from celery_agboss import AGBoss, OutboundCall, PaymentTask
from tests.integration.apps.shop import GatewayDeclined, charge_at_gateway, lookup_at_gateway
from tests.support.django_shop.celery import app

_GATEWAY = json.loads(os.environ.get("AGBOSS_DJANGO_TEST", "{}")).get("gateway_url", "")

charge_call = AGBoss.of(app).register(
    OutboundCall(
        name="django_shop.charge",
        send=charge_at_gateway(_GATEWAY),
        reconcile=lookup_at_gateway(_GATEWAY),
        is_definite_failure=lambda exc: isinstance(exc, GatewayDeclined),
        key_retention=timedelta(hours=24),
    )
)


@app.task(base=PaymentTask, bind=True, name="django_shop.charge_order")
def charge_order(self: Any, order_id: str, amount: int) -> dict[str, Any]:
    receipt = self.outbound(
        charge_call, {"amount": amount, "order": order_id}, business_key=f"order:{order_id}"
    )
    return {"payment": receipt["id"], "order": order_id}
