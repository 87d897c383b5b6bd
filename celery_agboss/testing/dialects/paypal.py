"""The paypal dialect of ``FakeGatewayServer`` (being written: no routes yet)."""

from __future__ import annotations

from typing import ClassVar

from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.gateway_types import GatewayCapabilities


class PayPalDialect:
    name = "paypal"
    documented_capabilities: ClassVar[GatewayCapabilities] = GatewayCapabilities()

    def install(self, server: FakeGatewayServer) -> None:
        """No routes yet."""
