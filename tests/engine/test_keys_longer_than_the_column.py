"""A business key the rules accept is a payment, however long its key is once encoded.

``validate_business_key`` counts code points (at most 512); the key column holds 512
characters. Percent-encoded, ``"注文" * 30`` (60 code points) is 540 characters before
the tenant and the call's name: a call with no ``max_key_length`` once kept it unfitted,
which PostgreSQL refused (``StringDataRightTruncation``, handled as a store outage,
retried for ever) and SQLite stored. Every key a step is kept under is now fitted to the
column (``core.keys.KEY_COLUMN_LENGTH``), on both stores; a key that fits is unchanged.
"""

from __future__ import annotations

from celery_agboss.core.keys import business_key, fit_key
from celery_agboss.store.schema import outbound_calls
from tests.engine.helpers import Shop, business_intent_key

KEY_COLUMN_LENGTH = outbound_calls.c.idempotency_key.type.length
"""The intent key column as the store declares it (512)."""

LONG = "注文" * 30
"""60 code points, 540 characters once percent-encoded."""


def test_a_valid_business_key_longer_than_the_key_column_once_encoded_charges_once(
    shop: Shop,
) -> None:
    call = shop.charge_call()  # no max_key_length, as a Checkout.com call or a user's own
    assert call.max_key_length is None
    with shop.start("exec-long-key") as ctx:
        receipt = ctx.outbound(call, {"amount": 1000}, business_key=LONG)
    assert receipt["amount"] == 1000
    with shop.start("exec-long-key-again") as again:
        assert again.outbound(call, {"amount": 1000}, business_key=LONG) == receipt
    assert [p["amount"] for p in shop.gateway.payments] == [1000], "one charge, once"
    raw = business_intent_key(shop.settings, LONG, call.name)
    assert len(raw) > KEY_COLUMN_LENGTH
    fitted = fit_key(raw, KEY_COLUMN_LENGTH)
    assert shop.store.read_intent(fitted) is not None, "kept under the fitted key"
    assert shop.gateway.payments[0]["idempotency_key"] == fitted, "the gateway's key too"


def test_a_long_business_key_of_a_fenced_effect_runs_it_once(shop: Shop) -> None:
    runs: list[int] = []
    for execution in ("exec-effect-1", "exec-effect-2"):
        with shop.start(execution) as ctx:
            ctx.fenced_effect("reserve", lambda conn: runs.append(1) or len(runs), LONG)
    assert runs == [1]


def test_two_long_business_keys_stay_two_payments(shop: Shop) -> None:
    call = shop.charge_call()
    other = "注文" * 29 + "注品"
    with shop.start("exec-a") as a, shop.start("exec-b") as b:
        a.outbound(call, {"amount": 1000}, business_key=LONG)
        b.outbound(call, {"amount": 1000}, business_key=other)
    assert len(shop.gateway.payments) == 2


def test_a_key_that_fits_the_column_is_unchanged(shop: Shop) -> None:
    call = shop.charge_call()
    with shop.start("exec-short") as ctx:
        ctx.outbound(call, {"amount": 500}, business_key="order:42")
    key = business_key(shop.settings.tenant, "order:42", call.name)
    assert shop.store.read_intent(key) is not None
    assert shop.gateway.payments[0]["idempotency_key"] == key
