"""What users test their own payment code with: fakes, a checklist, faults and sabotage.

Importing this package needs neither Celery nor SQLAlchemy: the fake gateway, the
clock, the checklist, fault points and sabotage switches are plain Python. Parts
that need the store (``celery_agboss.testing.stores``, the store contract suite in
``celery_agboss.testing.contract``) are imported from their own modules.

``FakeGatewayServer`` serves a fake over HTTP on 127.0.0.1 (plain JSON endpoints; the
dialects official SDKs speak are still to come).
"""

from __future__ import annotations

from celery_agboss.testing.checklist import (
    GatewayChecklistReport,
    GatewayCheckResult,
    GatewayCheckStatus,
    gateway_checklist,
)
from celery_agboss.testing.clock import SkewedHolderClock, VirtualClock
from celery_agboss.testing.fault_arming import (
    ArmedPoint,
    PausedPoint,
    PausedPointTimeoutError,
    arm_fault,
    arm_pause,
    arm_raise,
    arm_sleep,
    disarm_all,
)
from celery_agboss.testing.gateway import (
    FakeGateway,
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayFault,
    FakeGatewayTimeout,
    GatewayCapabilities,
    GatewayHold,
    GatewayRequest,
    GatewayRequestOutcome,
    is_definite_failure,
)
from celery_agboss.testing.gateway_server import FakeGatewayServer
from celery_agboss.testing.switches import SabotageRefusedError, sabotage

__all__ = [
    "ArmedPoint",
    "FakeGateway",
    "FakeGatewayError",
    "FakeGatewayErrorKind",
    "FakeGatewayFault",
    "FakeGatewayServer",
    "FakeGatewayTimeout",
    "GatewayCapabilities",
    "GatewayCheckResult",
    "GatewayCheckStatus",
    "GatewayChecklistReport",
    "GatewayHold",
    "GatewayRequest",
    "GatewayRequestOutcome",
    "PausedPoint",
    "PausedPointTimeoutError",
    "SabotageRefusedError",
    "SkewedHolderClock",
    "VirtualClock",
    "arm_fault",
    "arm_pause",
    "arm_raise",
    "arm_sleep",
    "disarm_all",
    "gateway_checklist",
    "is_definite_failure",
    "sabotage",
]
