"""An outbound call a task uses is registered on its first use, once per ``outbound()``;
another call object of the same name is still refused before anything is sent."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from celery_agboss import OutboundCall
from celery_agboss.core.engine_settings import OutboundRegistry
from celery_agboss.core.outbound import CallContext, Lookup
from celery_agboss.errors import ConfigurationError
from celery_agboss.testing.gateway_types import is_definite_failure
from tests.delivery.conftest import PaymentShop

NAME = "shop.first-use"


def _unregistered_call(shop: PaymentShop) -> OutboundCall:
    gateway = shop.gateway

    def send(call: CallContext) -> Any:
        return gateway.charge(call.request["amount"], call.idempotency_key)

    def reconcile(call: CallContext, lookup: Lookup) -> Any:
        raise AssertionError("nothing is pending: no lookup")

    return OutboundCall(
        name=NAME,
        send=send,
        reconcile=reconcile,
        key_retention=timedelta(hours=24),
        is_definite_failure=is_definite_failure,
    )


def test_one_outbound_registers_its_call_once_on_first_use(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch
) -> None:
    charge = _unregistered_call(shop)
    registered: list[str] = []
    register = OutboundRegistry.register

    def counting(self: OutboundRegistry, call: OutboundCall) -> OutboundCall:
        registered.append(call.name)
        return register(self, call)

    monkeypatch.setattr(OutboundRegistry, "register", counting)

    @shop.task()
    def pay(self: Any) -> Any:
        return self.outbound(charge, {"amount": 1})

    assert NAME not in shop.agboss.registry
    result = pay.apply()
    assert result.successful(), result.result
    assert registered == [NAME]
    assert shop.agboss.registry[NAME] is charge


def test_another_call_object_of_a_used_name_is_refused_before_anything_is_sent(
    shop: PaymentShop,
) -> None:
    first, namesake = _unregistered_call(shop), _unregistered_call(shop)

    @shop.task()
    def pay(self: Any, which: str) -> Any:
        return self.outbound(first if which == "first" else namesake, {"amount": 1})

    assert pay.apply(args=("first",)).successful()
    sent = len(shop.gateway.requests)
    result = pay.apply(args=("namesake",))
    assert result.failed() and isinstance(result.result, ConfigurationError)
    assert NAME in str(result.result)
    assert len(shop.gateway.requests) == sent
    assert shop.agboss.registry[NAME] is first
