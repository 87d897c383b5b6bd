"""Deliveries the adapter tests share: a first delivery that raised and asked for a
retry, a call whose answer the served fake drops, and the intent's status after.

Each test used to spell these out, with the intent key rebuilt by hand beside them; one
home keeps the key a test counts at the gateway the same key the delivery was sent under.
"""

from __future__ import annotations

from typing import Any, TypeVar

import pytest

from celery_agboss.core.outbound import OutboundCall
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.engine.helpers import Shop, business_intent_key, retry_asked

E = TypeVar("E", bound=BaseException)


def intent_status(shop: Shop, business_key: str, call_name: str) -> IntentStatus:
    """Where the store has the call's intent under ``business_key`` (it must have one)."""
    intent = shop.store.read_intent(business_intent_key(shop.settings, business_key, call_name))
    assert intent is not None
    return intent.status


def raised_then_retry_asked(
    shop: Shop, execution_id: str, call: OutboundCall, request: Any, error: type[E], **options: Any
) -> E:
    """The first delivery of ``execution_id``: ``call`` raises ``error`` and the body asks
    for a retry (``autoretry_for``), ending the delivery as a worker would, so the next
    delivery may send again. The error the body saw."""
    with shop.start(execution_id) as first:
        with pytest.raises(error) as raised:
            first.outbound(call, request, **options)
        retry_asked(first)
    return raised.value


def lose_at_the_gateway(
    shop: Shop,
    server: FakeGatewayServer,
    execution_id: str,
    call: OutboundCall,
    request: Any,
    business_key: str,
    operation: str | None = None,
) -> str:
    """``execution_id``'s ``call`` processed by the served fake (its next ``operation``,
    by default the call's own: ``stripe.charge`` -> ``charge``) and its answer dropped,
    under ``business_key``; the intent key the gateway keeps the request under, so a test
    can count at the gateway what each delivery got."""
    shop.lose_the_answer(
        execution_id,
        call,
        request,
        gateway=server.gateway,
        operation=operation or call.name.rsplit(".", 1)[-1],
        business_key=business_key,
    )
    return business_intent_key(shop.settings, business_key, call.name)


__all__ = ["intent_status", "lose_at_the_gateway", "raised_then_retry_asked"]
