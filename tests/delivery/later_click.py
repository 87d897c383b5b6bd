"""A later click on an order, written as docs/undo.md tells users to write it: told the
order's charge was compensated, it pays again under the order's next attempt key only
when told ``.undone``; a charge only *claimed for undo* (its refund not made yet) fails,
so the customer is never charged twice."""

from __future__ import annotations

from typing import Any

from celery_agboss import OutboundCall, OutboundCallCompensatedError


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
