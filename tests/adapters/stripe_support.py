"""The Stripe adapter against ``FakeGatewayServer`` (its Stripe dialect), for any test.

``adapter_for`` and ``charge_request`` are imported by name by the real-worker PS5
test too (tests/integration/apps/shop.py): keep their names and signatures.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_agboss.adapters.stripe import TEST_PAYMENT_METHOD, StripeAdapter
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.dialects.stripe import StripeDialect
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer

API_KEY = "sk_test_agboss_fake_gateway"
"""A test-mode key: the dialect refuses any other kind with Stripe's 401."""


def adapter_for(
    url: str,
    *,
    timeout: float = 2.0,
    attempt_timeout: float | None = None,
    name: str = "stripe",
) -> StripeAdapter:
    """The adapter pointed at the fake at ``url``, with short timeouts by default.

    ``attempt_timeout`` defaults to above ``timeout`` (5 s, or twice a longer timeout),
    as the adapter requires the SDK's timeout below the attempt's bound.
    """
    bound = attempt_timeout if attempt_timeout is not None else max(5.0, 2 * timeout)
    return StripeAdapter(API_KEY, base_url=url, timeout=timeout, attempt_timeout=bound, name=name)


def charge_request(reference: str, amount: int = 1000) -> dict[str, Any]:
    """What a task passes to ``self.outbound(adapter.charge, ...)``: Stripe's test card."""
    return {
        "amount": amount,
        "currency": "usd",
        "reference": reference,
        "source": TEST_PAYMENT_METHOD,
    }


def dialect_of(server: FakeGatewayServer) -> StripeDialect:
    dialect = server.dialect
    assert isinstance(dialect, StripeDialect), dialect
    return dialect


def _fresh_gateway(clock: VirtualClock | None = None) -> FakeGateway:
    return FakeGateway(
        clock=clock, capabilities=StripeDialect.documented_capabilities, hold_timeout=20.0
    )


@pytest.fixture(scope="module", name="stripe_server")
def stripe_server_fixture() -> Iterator[FakeGatewayServer]:
    """One server per test module; ``stripe_fake`` gives each test a fresh gateway on it."""
    with FakeGatewayServer(_fresh_gateway(), dialect=StripeDialect()) as server:
        yield server


@pytest.fixture(name="stripe_fake")
def stripe_fake_fixture(
    stripe_server: FakeGatewayServer, db_clock: VirtualClock
) -> Iterator[FakeGatewayServer]:
    """The module's server with a fresh gateway on this test's ``db_clock``, set to what
    Stripe documents, and a consistent search (``dialect_of(server).search_lag = 0``)."""
    dialect = dialect_of(stripe_server)
    dialect.search_lag = 0.0
    dialect.clear_answers()
    stripe_server.gateway = _fresh_gateway(db_clock)
    try:
        yield stripe_server
    finally:
        stripe_server.gateway.close()
        dialect.clear_answers()


__all__ = [
    "API_KEY",
    "adapter_for",
    "charge_request",
    "dialect_of",
    "stripe_fake_fixture",
    "stripe_server_fixture",
]
