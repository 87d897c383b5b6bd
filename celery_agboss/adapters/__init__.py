"""Gateway adapters: each gateway's money-moving calls as ``OutboundCall`` objects.

One module per gateway (``stripe``, ``checkout``, ``adyen``, ``paypal``), each talking
through the gateway's official Python SDK, installed with its extra
(``pip install celery_agboss[stripe]``). Importing this package imports no SDK; a
module imports its own. What every adapter shares (the protocol the checklist probes,
the timeout rule, error classification) is in ``celery_agboss.adapters.common``.
docs/gateways.md says, per gateway, whether a customer can be charged twice.
"""

from __future__ import annotations

from celery_agboss.adapters.common import GatewayAdapter

__all__ = ["GatewayAdapter"]
