"""A request's ``amount`` in ISO 4217 minor units, and in a gateway's own units: the one
conversion every adapter makes, both ways.

``amount`` is ISO 4217 minor units on every adapter (docs/gateways.md): 1000 USD is
10.00 USD, 1000 JPY is 1,000 JPY, 1000 ISK is 1,000 ISK (ISO 4217 gives the króna no
decimals). Most gateways count amounts the same way, but not in every currency: Stripe
writes ISK with two decimals (an ISK amount of 100 is 1 króna) and MGA with none,
Adyen CLP and ISK with two and CVE and IDR with none, Checkout.com CLP with two. Each
adapter names where its gateway differs (a :class:`GatewayUnits`), and converts every
amount it sends with :func:`to_gateway` and every amount it reads back with
:func:`from_gateway`, so results and reconcile stay in ISO units and compare like with
like. Gateways are named only to identify their public APIs.

An amount the gateway cannot write exactly (a fraction of a whole unit where the gateway
has fewer decimals than ISO 4217, or a three-decimal amount whose last digit is not 0
where the gateway asks for one) is refused before anything is sent, with the adapter's
own request-refused error (definite: nothing was sent), never rounded: rounding would
charge another amount than the request's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

ISO_EXPONENTS: Mapping[str, int] = MappingProxyType(
    {
        **dict.fromkeys(("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW"), 0),
        **dict.fromkeys(("PYG", "RWF", "UGX", "UYI", "VND", "VUV", "XAF", "XOF", "XPF"), 0),
        **dict.fromkeys(("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"), 3),
        **dict.fromkeys(("CLF", "UYW"), 4),
    }
)
"""ISO 4217's minor-unit exponent where it is not 2: what a request's ``amount`` counts."""


def _tens(power: int) -> int:
    """``10 ** power`` for a power >= 0, typed as the int it is."""
    return int(10**power)


def iso_exponent(currency: str) -> int:
    """ISO 4217's decimals of ``currency`` (any case): 2 unless :data:`ISO_EXPONENTS` says."""
    return ISO_EXPONENTS.get(currency.upper(), 2)


@dataclass(frozen=True)
class GatewayUnits:
    """How one gateway writes amounts: ``exponents`` are its decimals where they differ
    from ISO 4217's (upper-case codes), ``tens_in_three_decimals`` its rule that an amount
    in a three-decimal currency ends in 0, and ``refused`` makes the adapter's own
    request-refused error from a message (definite: nothing is sent)."""

    gateway: str
    exponents: Mapping[str, int]
    refused: Callable[[str], Exception]
    tens_in_three_decimals: bool = False

    def __post_init__(self) -> None:
        exponents = {code.upper(): places for code, places in self.exponents.items()}
        object.__setattr__(self, "exponents", MappingProxyType(exponents))

    def exponent(self, currency: str) -> int:
        """The gateway's decimals of ``currency``."""
        return self.exponents.get(currency.upper(), iso_exponent(currency))

    def step(self, currency: str) -> int:
        """The smallest ISO amount the gateway writes exactly (every valid one is a
        multiple of it): 1 unless the gateway has fewer decimals, or wants a last 0."""
        iso, places = iso_exponent(currency), self.exponent(currency)
        tens = 10 if self.tens_in_three_decimals and places == 3 else 1
        # amount * 10**places / 10**iso must be a whole multiple of ``tens``
        whole = tens * _tens(iso)
        return whole // math.gcd(whole, _tens(places))


def _how(units: GatewayUnits, code: str) -> str:
    places = units.exponent(code)
    if units.tens_in_three_decimals and places == 3 and places >= iso_exponent(code):
        return "with its last (third) decimal 0 only"
    return "in whole units only" if places == 0 else f"with {places} decimals only"


def to_gateway(amount: int, currency: str, units: GatewayUnits) -> int:
    """``amount`` (ISO 4217 minor units) as the gateway writes it: ×100 for Stripe's ISK,
    ÷100 for its MGA, unchanged where the gateway counts as ISO 4217 does. An amount the
    gateway cannot write exactly is refused (``units.refused``), naming the currency, the
    amount and the nearest amounts it can take: never rounded."""
    code = currency.upper()
    step = units.step(code)
    if amount % step:
        lower, upper = amount // step * step, (amount // step + 1) * step
        nearest = f"{lower} or {upper}" if lower > 0 else f"{upper}"
        raise units.refused(
            f"request field 'amount' {amount} {code} is in ISO 4217 minor units "
            f"(1/{10 ** iso_exponent(code)} {code}), and {units.gateway} takes {code} "
            f"{_how(units, code)}: send a multiple of {step} ({nearest} here)"
        )
    shift = units.exponent(code) - iso_exponent(code)
    return amount * _tens(shift) if shift >= 0 else amount // _tens(-shift)


def from_gateway(amount: Any, currency: Any, units: GatewayUnits) -> int | None:
    """An amount the gateway wrote (in ``currency``) back in ISO 4217 minor units: the
    inverse of :func:`to_gateway`. None when it is not an int, the currency is not a
    code, or it is no whole number of ISO minor units (an amount no request of ours
    made: compared with the request's, it differs)."""
    if isinstance(amount, bool) or not isinstance(amount, int) or not isinstance(currency, str):
        return None
    code = currency.upper()
    shift = iso_exponent(code) - units.exponent(code)
    if shift >= 0:
        return amount * _tens(shift)
    whole, rest = divmod(amount, _tens(-shift))
    return None if rest else whole


__all__ = ["GatewayUnits", "from_gateway", "iso_exponent", "to_gateway"]
