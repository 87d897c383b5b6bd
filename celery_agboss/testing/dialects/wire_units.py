"""How each gateway the fake speaks writes an amount on its wire, as its public docs say,
apart from the adapters' own tables (``celery_agboss.adapters.minor_units``): a fake
that shared them would agree with an adapter's mistake instead of catching it.

The fake keeps money as ``FakeGateway`` does, in ISO 4217 minor units (its ``payments``,
``refunds`` and ``requests`` count what the merchant meant, on every dialect); a dialect
reads a wire amount into them with :meth:`WireUnits.from_wire` and writes them back with
:meth:`WireUnits.to_wire`. Gateways are named only to identify their public APIs.

- Stripe (supported-currencies page; support page "Deprecation of fractional ISK charges
  and refunds"): zero-decimal BIF CLP DJF GNF JPY KMF KRW MGA PYG RWF UGX VND VUV XAF XOF
  XPF; three-decimal BHD JOD KWD OMR TND, the last digit 0; ISK two-decimal, in
  multiples of 100 ("an ISK amount of 100 will continue to represent 1 króna"); every
  other currency two-decimal.
- Checkout.com ("Format the amount value"): the full amount for BIF DJF GNF ISK JPY KMF
  KRW PYG RWF UGX VUV VND XAF XOF XPF; ÷1000 for BHD IQD JOD KWD LYD OMR TND, the last
  digit 0; ÷100 for every other currency (CLP included).
- Adyen ("Currency codes and minor units"): ISO 4217's decimals, except CLP 2, CVE 0,
  IDR 0 and ISK 2 ("differs from standard").
"""

from __future__ import annotations

from dataclasses import dataclass


def _codes(text: str) -> list[str]:
    return text.split()


_ISO_4217_EXPONENTS = {
    **dict.fromkeys(
        _codes("BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX UYI VND VUV XAF XOF XPF"),
        0,
    ),
    **dict.fromkeys(_codes("BHD IQD JOD KWD LYD OMR TND"), 3),
    **dict.fromkeys(_codes("CLF UYW"), 4),
}
"""ISO 4217's minor-unit exponent where it is not 2: what the fake's amounts count."""


def _tens(power: int) -> int:
    return int(10**power)


def iso_exponent(currency: str) -> int:
    return _ISO_4217_EXPONENTS.get(currency.upper(), 2)


@dataclass(frozen=True)
class WireUnits:
    """One gateway's decimals per currency (``decimals``: where not 2) and whether its
    three-decimal amounts must end in 0 (``tens_in_three_decimals``)."""

    gateway: str
    decimals: dict[str, int]
    tens_in_three_decimals: bool = False

    def places(self, currency: str) -> int:
        return self.decimals.get(currency.upper(), 2)

    def wire_issue(self, value: int, currency: str) -> str | None:
        """Why the gateway (or the fake, which keeps ISO 4217 minor units) cannot take
        ``value`` in ``currency``; None when it can."""
        code = currency.upper()
        places = self.places(code)
        if self.tens_in_three_decimals and places == 3 and value % 10:
            return f"{self.gateway} takes {code} amounts with the last digit 0"
        shift = places - iso_exponent(code)
        if shift > 0 and value % _tens(shift):
            return f"{value} {code} is no whole number of ISO 4217 minor units"
        return None

    def from_wire(self, value: int, currency: str) -> int | None:
        """A wire amount in ISO 4217 minor units; None when :meth:`wire_issue` names why
        it cannot be taken."""
        if self.wire_issue(value, currency) is not None:
            return None
        shift = self.places(currency) - iso_exponent(currency)
        return value // _tens(shift) if shift >= 0 else value * _tens(-shift)

    def to_wire(self, amount: int, currency: str) -> int:
        """ISO 4217 minor units as the gateway writes them (exact: the fake only keeps
        amounts it took from its wire, or a test made in a currency the gateway writes)."""
        shift = self.places(currency) - iso_exponent(currency)
        if shift >= 0:
            return amount * _tens(shift)
        whole, rest = divmod(amount, _tens(-shift))
        if rest:
            raise ValueError(f"{amount} {currency} cannot be written on {self.gateway}'s wire")
        return whole


STRIPE = WireUnits(
    "Stripe",
    {
        **dict.fromkeys(
            _codes("BIF CLP DJF GNF JPY KMF KRW MGA PYG RWF UGX VND VUV XAF XOF XPF"),
            0,
        ),
        **dict.fromkeys(_codes("BHD JOD KWD OMR TND"), 3),
        "ISK": 2,
    },
    tens_in_three_decimals=True,
)
CHECKOUT = WireUnits(
    "Checkout.com",
    {
        **dict.fromkeys(
            _codes("BIF DJF GNF ISK JPY KMF KRW PYG RWF UGX VUV VND XAF XOF XPF"),
            0,
        ),
        **dict.fromkeys(_codes("BHD IQD JOD KWD LYD OMR TND"), 3),
    },
    tens_in_three_decimals=True,
)
ADYEN = WireUnits(
    "Adyen",
    {
        **{code: places for code, places in _ISO_4217_EXPONENTS.items() if places != 2},
        "CLP": 2,
        "CVE": 0,
        "IDR": 0,
        "ISK": 2,
    },
)


__all__ = ["ADYEN", "CHECKOUT", "STRIPE", "WireUnits", "iso_exponent"]
