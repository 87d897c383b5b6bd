"""The Checkout.com adapter against a ``FakeGatewayServer`` speaking its dialect.

``adapter_for`` and ``charge_request`` are imported by name by other suites (the
real-worker PS5 test): keep both.
"""

from __future__ import annotations

import os
from typing import Any

from requests import PreparedRequest

from celery_agboss.adapters.checkout import CheckoutAdapter
from celery_agboss.testing.dialects.checkout import CheckoutDialect
from celery_agboss.testing.gateway_server import PID_HEADER, FakeGatewayServer

# The SDK checks a key's shape (sk_sbox_ + 26 base32 letters + one more); this one is fake.
SECRET_KEY = "sk_sbox_" + "agbossfakekeyfortestsonlyq" + "a"
TEST_TOKEN = "tok_agbossfaketestvisa"
DECLINED_TOKEN = "tok_chargeDeclined"  # the server's declined card (DECLINED_CARD)


def _with_pid(request: PreparedRequest) -> PreparedRequest:
    """Say which process sends (read at each request, so a forked worker says its own)."""
    request.headers[PID_HEADER] = str(os.getpid())
    return request


HTTP_TIMEOUT_S = 4.0
"""The harness's HTTP timeout: short, but no test waits on it (a test whose timeout fires
passes its own), and 2 s once let a set-up's charge time out in a CI run on a stalled
machine."""


def adapter_for(url: str, **options: Any) -> CheckoutAdapter:
    """The adapter on the fake at ``url``, with short timeouts (``options`` replace them);
    its requests carry the sender's pid, as the fake server's ``charges_seen`` reads it."""
    settings: dict[str, Any] = {"timeout": HTTP_TIMEOUT_S, "attempt_timeout": 5, **options}
    adapter = CheckoutAdapter(SECRET_KEY, base_url=url, **settings)
    adapter.http_client.auth = _with_pid
    return adapter


def charge_request(reference: str, amount: int = 1000) -> dict[str, Any]:
    """A charge (or authorize) request of the order ``reference``, paid with a test token."""
    return {"amount": amount, "currency": "usd", "reference": reference, "source": TEST_TOKEN}


def dialect_of(server: FakeGatewayServer) -> CheckoutDialect:
    dialect = server.dialect
    assert isinstance(dialect, CheckoutDialect), dialect
    return dialect
