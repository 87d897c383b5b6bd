"""What Adyen's requests are held to before anything is sent, without its SDK: the
request-refused error and how Adyen writes amounts (so a webhook endpoint can read an
Adyen amount with no SDK installed). Adyen is named only to identify its public API."""

from __future__ import annotations

from celery_agboss.adapters.minor_units import GatewayUnits


class AdyenRequestError(ValueError):
    """The request dict is malformed; raised before anything is sent."""


ADYEN_UNITS = GatewayUnits("Adyen", {"CLP": 2, "CVE": 0, "IDR": 0, "ISK": 2}, AdyenRequestError)
"""How Adyen writes amounts where it differs from ISO 4217 (its "Currency codes and
minor units" page): CLP and ISK with two decimals (ISO 4217: none), CVE and IDR with
none (ISO 4217: two)."""


__all__ = ["ADYEN_UNITS", "AdyenRequestError"]
