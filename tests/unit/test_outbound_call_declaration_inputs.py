"""An ``OutboundCall`` declared with a value of the wrong kind is refused where it is
declared, naming the call and the field: accepted, each one changed what happens to a
payment later (a truthy text switching off the key-age bound of a resend, a field name
for the gateway id reader, a tuple where a function tells a definite failure)."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import pytest

from celery_agboss import NotSent, OutboundCall
from celery_agboss.errors import OutboundCallDefinitionError


def send(ctx: Any) -> Any:
    return {"id": "ch_1"}


def reconcile(ctx: Any, lookup: Any) -> Any:
    return NotSent()


def declare(**options: Any) -> OutboundCall:
    base: dict[str, Any] = {
        "name": "inputs.charge",
        "send": send,
        "reconcile": reconcile,
        "key_retention": timedelta(hours=24),
    }
    return OutboundCall(**{**base, **options})


@pytest.mark.parametrize(
    "field, value",
    [
        ("lookup_proves_absence", "no"),  # text from an env var or YAML: read as True
        ("lookup_proves_absence", "false"),
        ("lookup_proves_absence", 1),
        ("lookup_proves_absence", None),
        ("transaction_id", "id"),  # the receipt field's name instead of a reader
        ("is_definite_failure", (ValueError,)),  # exception classes instead of a function
        ("is_definite_failure", True),
        ("is_definite_failure", None),
        ("max_key_length", "64"),
        ("max_key_length", 64.5),
        ("max_key_length", True),
        ("key_retention", "24h"),
        ("moves_money", "no"),  # read as True would be safe, but text is not an answer
        ("moves_money", 0),
        ("moves_money", None),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused_naming_the_call_and_field(
    field: str, value: Any
) -> None:
    with pytest.raises(OutboundCallDefinitionError) as refused:
        declare(**{field: value})
    assert refused.value.rule == field  # type: ignore[attr-defined]
    message = str(refused.value)
    assert "inputs.charge" in message and field in message, message
    assert repr(value) in message, message


def test_text_for_lookup_proves_absence_is_refused_even_without_key_retention() -> None:
    """Without key_retention, "no" passed for the proof the omission needs."""
    with pytest.raises(OutboundCallDefinitionError, match="lookup_proves_absence"):
        declare(key_retention=None, lookup_proves_absence="no")


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda ctx: NotSent(), id="one-parameter"),
        pytest.param(lambda: NotSent(), id="no-parameter"),
        pytest.param(lambda ctx, lookup, extra: NotSent(), id="a-third-required"),
        pytest.param(lambda *, ctx, lookup: NotSent(), id="keyword-only"),
    ],
)
def test_a_reconcile_that_cannot_take_ctx_and_lookup_is_refused(bad: Any) -> None:
    with pytest.raises(OutboundCallDefinitionError, match="reconcile") as refused:
        declare(reconcile=bad)
    assert refused.value.rule == "reconcile"  # type: ignore[attr-defined]
    assert "inputs.charge" in str(refused.value)


class _Reconciler:
    def __call__(self, ctx: Any, lookup: Any) -> Any:
        return NotSent()

    def method(self, ctx: Any, lookup: Any) -> Any:
        return NotSent()


def _three(ctx: Any, lookup: Any, gateway: Any) -> Any:
    return NotSent()


def _defaulted(ctx: Any, lookup: Any, retries: int = 3) -> Any:
    return NotSent()


@pytest.mark.parametrize(
    "good",
    [
        pytest.param(reconcile, id="function"),
        pytest.param(lambda *args: NotSent(), id="star-args"),
        pytest.param(lambda *args, **kwargs: NotSent(), id="star-args-kwargs"),
        pytest.param(lambda ctx, *rest: NotSent(), id="one-then-star"),
        pytest.param(_defaulted, id="a-defaulted-third"),
        pytest.param(_Reconciler(), id="callable-object"),
        pytest.param(_Reconciler().method, id="bound-method"),
        pytest.param(functools.partial(_three, gateway=None), id="partial"),
        pytest.param(dict.get, id="builtin-with-a-signature"),
        pytest.param(max, id="builtin-whose-signature-cannot-be-read"),
    ],
)
def test_a_reconcile_that_can_take_ctx_and_lookup_is_accepted(good: Any) -> None:
    assert declare(reconcile=good).reconcile is good


@pytest.mark.parametrize(
    "options",
    [
        {"lookup_proves_absence": True, "key_retention": None},
        {"lookup_proves_absence": False},
        {"transaction_id": lambda receipt: receipt["id"]},
        {"transaction_id": None},
        {"is_definite_failure": lambda exc: isinstance(exc, ValueError)},
        {"max_key_length": 64},
        {"max_key_length": None},
        {"key_retention": 86400},
        {"key_retention": 86400.0},
        {"moves_money": False},
        {"moves_money": True},
    ],
    ids=lambda options: ",".join(  # no function's address: xdist workers must agree
        f"{k}={'fn' if callable(v) else v!r}" for k, v in options.items()
    ),
)
def test_what_a_declaration_may_say_is_still_accepted(options: dict[str, Any]) -> None:
    declare(**options)


def test_the_default_is_definite_failure_reads_nothing_as_definite() -> None:
    assert declare().is_definite_failure(ValueError("declined")) is False
