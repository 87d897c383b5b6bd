"""A hold at the fake gateway server keeps one charge's answer; one that names a
reference is taken only by a charge for it, so a late charge of an earlier test (still
on its way to the gateway) cannot take the hold and name the wrong sender."""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any

from celery_agboss.testing.gateway_server import FakeGatewayServer


def _charge(server: FakeGatewayServer, reference: str, out: list[Any]) -> None:
    body = json.dumps({"amount": 100, "reference": reference, "idempotency_key": reference})
    request = urllib.request.Request(
        f"{server.url}/charge", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        out.append(json.loads(response.read()))


def test_a_hold_for_a_reference_lets_other_charges_through_and_takes_its_own() -> None:
    with FakeGatewayServer(dialect=None, hold_timeout=10) as server:
        held = server.hold_next_answer(timeout=10, reference="order-2")
        answers: list[Any] = []
        _charge(server, "order-1", answers)  # answered at once: not the held reference
        assert len(answers) == 1 and not held.reached
        second = threading.Thread(target=_charge, args=(server, "order-2", answers))
        second.start()
        assert held.wait_reached(10)
        assert held.reference == "order-2" and len(answers) == 1
        held.release()
        second.join(10)
        assert len(answers) == 2


def test_a_hold_without_a_reference_takes_the_next_charge() -> None:
    with FakeGatewayServer(dialect=None, hold_timeout=10) as server:
        held = server.hold_next_answer(timeout=10)
        answers: list[Any] = []
        first = threading.Thread(target=_charge, args=(server, "order-1", answers))
        first.start()
        assert held.wait_reached(10)
        assert held.reference == "order-1" and answers == []
        held.release()
        first.join(10)
        assert len(answers) == 1
