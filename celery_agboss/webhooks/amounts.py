"""An amount a gateway's webhook (or a read of its object) carries, in the units the
charge was asked in.

Requests and results count ``amount`` in ISO 4217 minor units on every adapter
(docs/gateways.md), but a webhook's payload is the object as the gateway writes it: in
the gateway's own units where they differ (Stripe's ISK with two decimals, Adyen's and
Checkout.com's CLP with two, ...). Compared as it comes with an order's amount, a genuine
payment of the order reads as another payment, and the order stays unpaid in exactly
those currencies. The tables are the adapters' own, so an event and a result agree.
"""

from __future__ import annotations

from typing import Any

from celery_agboss.adapters.adyen_requests import ADYEN_UNITS
from celery_agboss.adapters.checkout_requests import CHECKOUT_UNITS
from celery_agboss.adapters.minor_units import GatewayUnits, from_gateway
from celery_agboss.adapters.stripe_requests import STRIPE_UNITS
from celery_agboss.webhooks.events import ADYEN, CHECKOUT, GATEWAYS, STRIPE

_UNITS: dict[str, GatewayUnits] = {
    STRIPE: STRIPE_UNITS,
    CHECKOUT: CHECKOUT_UNITS,
    ADYEN: ADYEN_UNITS,
}


def amount_in_iso_units(gateway: str, amount: Any, currency: Any) -> int | None:
    """``amount`` as ``gateway`` wrote it (``event.gateway``: ``"stripe"``,
    ``"checkout"``, ``"adyen"``), in ISO 4217 minor units, as the charge's request gave
    it: Stripe's ``amount_received`` 100000 in ``"isk"`` is 1000. None when it is no
    whole amount in a currency code (compared with the order's, it differs)."""
    units = _UNITS.get(gateway)
    if units is None:
        raise ValueError(f"unknown webhook gateway {gateway!r}; one of {', '.join(GATEWAYS)}")
    return from_gateway(amount, currency, units)


__all__ = ["amount_in_iso_units"]
