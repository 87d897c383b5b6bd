"""``FakeGatewayServer.error_status`` is each server's own: one test's gateway quirk
(a status changed on its server) must not leak into the next test's server."""

from __future__ import annotations

from celery_agboss.testing import FakeGatewayError, FakeGatewayErrorKind
from celery_agboss.testing.gateway_server import FakeGatewayServer

CONFLICT = FakeGatewayErrorKind.CONFLICT


def test_changing_one_servers_error_status_leaves_the_other_servers_alone() -> None:
    first = FakeGatewayServer(dialect=None)
    try:
        first.error_status[CONFLICT] = 200  # this test's gateway quirk
        later = FakeGatewayServer(dialect=None)  # the next test's server
        assert later.error_status[CONFLICT] == 409
        assert FakeGatewayServer.error_status[CONFLICT] == 409
        assert first.error_reply(FakeGatewayError(CONFLICT)).status == 200
        assert later.error_reply(FakeGatewayError(CONFLICT)).status == 409
    finally:
        FakeGatewayServer.error_status[CONFLICT] = 409  # only if the copy was missing


def test_a_subclass_status_is_what_its_servers_start_with() -> None:
    class Quirky(FakeGatewayServer):
        error_status = {**FakeGatewayServer.error_status, CONFLICT: 422}

    assert Quirky(dialect=None).error_status[CONFLICT] == 422
    assert FakeGatewayServer(dialect=None).error_status[CONFLICT] == 409
