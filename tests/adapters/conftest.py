"""Fixtures of the adapter suite: an official SDK against ``FakeGatewayServer``.

Each gateway's tests get the engine suite's ``shop`` (deliveries on a store, a
``VirtualClock`` shared by the database and the gateway) and ``served(name)``: the
fake gateway behind an HTTP server speaking that gateway's dialect, set to the
capabilities its docs state. The store runs on SQLite only here: what these tests
prove is the adapter's classification and reconcile through the real SDK; the store
itself is proven on both backends by the contract and engine suites.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.outbound import OutboundCall, Outcome
from celery_agboss.errors import OutboundCallOutcomeUnknownError, OutboundCallUnreconciledError
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.checklist import GatewayChecklistReport, gateway_checklist
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer, documented_capabilities
from celery_agboss.testing.gateway_types import FakeGatewayFault
from tests.adapters.deliveries import lose_at_the_gateway
from tests.adapters.own_payment_support import support, theirs
from tests.contract.conftest import db_clock, store, store_backend, store_factory
from tests.engine.conftest import settings
from tests.engine.helpers import Shop, step_intent_key
from tests.support.stores import fresh_store_url

__all__ = ["db_clock", "settings", "store", "store_backend", "store_factory", "theirs"]


@pytest.fixture(params=["sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite only (see the module docstring)."""
    return fresh_store_url(request, tmp_path, "store")


ServeFn = Callable[..., FakeGatewayServer]


@pytest.fixture
def served(db_clock: VirtualClock) -> Iterator[ServeFn]:
    """``served("stripe", **capability_overrides)``: a started server on ``db_clock``.

    The gateway gets its dialect's ``documented_capabilities`` (overrides replace
    single fields), so a test runs against what the gateway's docs promise; every server
    made is stopped after the test.
    """
    made: list[FakeGatewayServer] = []

    def serve(name: str, *, dialect: Any = None, **overrides: Any) -> FakeGatewayServer:
        capabilities = documented_capabilities(name)
        if overrides:
            capabilities = type(capabilities)(**{**capabilities.__dict__, **overrides})
        gateway = FakeGateway(clock=db_clock, capabilities=capabilities, hold_timeout=20.0)
        server = FakeGatewayServer(gateway, dialect=dialect or name, hold_timeout=20.0)
        made.append(server)
        return server.start()

    try:
        yield serve
    finally:
        for server in made:
            server.stop()


AdapterOn = Callable[..., tuple[FakeGatewayServer, Any]]


@pytest.fixture
def adapter_on(served: ServeFn) -> AdapterOn:
    """``adapter_on("checkout", **capability_overrides)``: ``served(…)``'s server and the
    gateway's SDK adapter on it (``tests.adapters.<gateway>_support.adapter_for``: short
    timeouts), the set-up most adapter tests start from."""

    def on(name: str, **overrides: Any) -> tuple[FakeGatewayServer, Any]:
        server = served(name, **overrides)
        return server, support(name).adapter_for(server.url)

    return on


@pytest.fixture
def shop(
    store: SQLAlchemyStore,
    store_factory: Callable[..., SQLAlchemyStore],
    settings: EngineSettings,
    db_clock: VirtualClock,
) -> Shop:
    """Deliveries on ``store``; its ``gateway`` is a bare fake, unused by adapter tests."""
    return Shop(store, store_factory, settings, FakeGateway(clock=db_clock), db_clock)


def checklist(adapter: Any, clock: VirtualClock, retention: float) -> GatewayChecklistReport:
    """The gateway checklist through the adapter's SDK, asking for ``retention`` seconds
    of kept keys (what the gateway documents)."""
    return gateway_checklist(
        adapter.send, adapter.lookup, clock=clock, required_retention=retention
    )


def checklist_shows(
    adapter: Any, clock: VirtualClock, retention: float, statuses: dict[str, Any]
) -> GatewayChecklistReport:
    """:func:`checklist` through ``adapter``, which must show ``statuses`` (the level
    the gateway documents); the report, for what a test reads beyond the statuses."""
    report = checklist(adapter, clock, retention)
    assert report.statuses() == statuses, str(report)
    return report


def refund_from_every_path(
    shop: Shop, server: FakeGatewayServer, refund: OutboundCall, request: Any, business_key: str
) -> tuple[Any, Outcome | None]:
    """PS19: a refund whose answer is lost is sent again by its own delivery, then once
    more from another path (an operator's) under the same business key, which must get
    the same refund replayed. Returns the refund and how the retry got it."""
    lose_at_the_gateway(shop, server, "saga-undo", refund, request, business_key)
    with shop.start("saga-undo") as retry:
        refunded = retry.outbound(refund, request, business_key=business_key)
        outcome = retry.last_outcome
    with shop.start("operator-refund") as other:
        assert other.outbound(refund, request, business_key=business_key) == refunded
        assert other.last_outcome is Outcome.REPLAYED
    return refunded, outcome


def resend_waits_for_an_operator(
    shop: Shop, call: OutboundCall, request: Any, execution_id: str, step: str
) -> str:
    """PS17 past the key's window: the resend is refused as unreconciled and its intent
    (``step`` of ``execution_id``) waits for an operator. Returns the operator's reason."""
    with shop.start(execution_id) as second, pytest.raises(OutboundCallUnreconciledError):
        second.outbound(call, request)
    intent = shop.store.read_intent(step_intent_key(shop.settings, execution_id, step))
    assert intent is not None and intent.needs_operator
    return intent.operator_reason or ""
