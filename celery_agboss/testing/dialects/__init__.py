"""The gateway APIs ``FakeGatewayServer`` speaks, so official SDKs can be tested offline.

A dialect translates one gateway's HTTP API (paths, bodies, headers, error shapes) into
calls on the one :class:`~celery_agboss.testing.FakeGateway` behind the server, so the
fake's ``payments`` and ``requests`` count what the SDK sent, and its capability
switches and faults apply whichever API was spoken. Each dialect module also names the
capabilities its gateway documents (``documented_capabilities``), which the adapters'
checklist tests set the fake to.
"""

from __future__ import annotations

from celery_agboss.testing.gateway_server import (
    DIALECTS,
    Dialect,
    dialect_class,
    documented_capabilities,
    resolve_dialect,
)

__all__ = ["DIALECTS", "Dialect", "dialect_class", "documented_capabilities", "resolve_dialect"]
