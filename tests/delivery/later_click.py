"""A later click on an order, written as docs/undo.md tells users to write it: told the
order's charge was compensated, it pays again under the order's next attempt key only
when told ``.undone``; a charge only *claimed for undo* (its refund not made yet) fails,
so the customer is never charged twice. And what the tests of such clicks share: the
order's refund task found once recorded, where a click may end, and the wait a click makes
for a claimed undo, shortened."""

from __future__ import annotations

from typing import Any

import pytest

from celery_agboss import OutboundCall, OutboundCallCompensatedError
from celery_agboss.core import state_machine
from celery_agboss.core.executions import ExecutionRecord
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

ENDED = ("COMPLETED", "FAILED", "WAITING_OPERATOR", "CANCELLED")
"""Every end a click may reach: the test judges it by what it was told."""


def charge_unless_still_claimed(
    task: Any, charge: OutboundCall, order: str, told: list[OutboundCallCompensatedError]
) -> Any:
    """The order's charge of 1000 (``order:<order>``), or its second attempt once the first
    was undone; what the click was told is appended to ``told``."""
    request = {"amount": 1000, "order": order}
    try:
        return task.outbound(charge, request, business_key=f"order:{order}")
    except OutboundCallCompensatedError as exc:
        told.append(exc)
        if not exc.undone:  # claimed for undo, not refunded (yet): never pay twice
            raise
        return task.outbound(charge, request, business_key=f"order:{order}:attempt:2")


def refund_task_execution(shop: PaymentShop, *states: str, timeout: float = 20) -> ExecutionRecord:
    """The execution of the order's refund task (``shop.refund_payment``, an undo declared
    as a signature) once recorded, and in one of ``states`` when given."""

    def found() -> ExecutionRecord | None:
        executions = shop.agboss.executions.list_executions(None, limit=50)
        tasks = [
            r
            for r in executions
            if r.task_name == "shop.refund_payment" and (not states or r.state.value in states)
        ]
        return tasks[0] if tasks else None

    waited_for = f"the refund task {'/'.join(states)}".rstrip()
    record: ExecutionRecord = wait_until(found, timeout, message=waited_for)
    return record


@pytest.fixture(autouse=True)
def short_wait_for_a_claimed_undo(monkeypatch: pytest.MonkeyPatch) -> None:
    """A click that meets a claimed step waits up to 5 s for its undo to be done; nothing
    finishes it meanwhile in these tests (the refund task queued, or waiting for a person),
    so 0.3 s says the same. Autouse in a test module that binds it to a name of its own."""
    monkeypatch.setattr(state_machine, "COMPENSATION_WAIT_S", 0.3)
