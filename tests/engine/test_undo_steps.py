"""Undo once (design: PS10), engine side: declarations, done marks and the order undos run in.

A "delivery" is an ``ExecutionContext``; a crash is a ``Crash`` raised inside an undo,
after which the context is dropped without releasing its lease (what a SIGKILL leaves)
and the database clock is moved past it. Each protection has a twin without it.
P5: a crash is a hand-over, never a failure; an undo marked done never runs again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from celery_agboss.core.compensation import (
    DONE_RECORD,
    FAILURE,
    UndoContext,
    UndoStep,
    compensation_key,
    declare_undo,
    read_declarations,
    run_undos,
    trail_of,
)
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.outbound import CallContext, Completed, Lookup, NotSent, OutboundCall
from celery_agboss.core.protections import UNDO_NOT_MARKED_DONE
from celery_agboss.errors import ConfigurationError, ExecutionFencedError
from celery_agboss.testing import FakeGateway, sabotage
from tests.engine.helpers import DAY, Crash, Shop, business_intent_key

UndoFunctions = dict[str, Callable[..., Any]]

sqlite_only = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
"""For checks of this module's own logic: the store's part is the same on both."""


_refund_call_of_this_test: list[tuple[FakeGateway, OutboundCall]] = []


def _refund_call(shop: Shop) -> OutboundCall:
    """One refund call per test (its name is registered once per registry), bound to this
    test's gateway: the cache holds the gateway itself, never its ``id()``, which a later
    test's gateway may reuse once this one is collected."""
    for gateway, made in _refund_call_of_this_test:
        if gateway is shop.gateway:
            return made
    gateway = shop.gateway

    def send(call: CallContext) -> Any:
        return gateway.refund(call.request["payment"], call.idempotency_key)

    def reconcile(call: CallContext, lookup: Lookup) -> Any:
        found = gateway.lookup(lookup.idempotency_key)
        return NotSent() if found is None else Completed(found)

    made = OutboundCall(
        name="fake.refund", send=send, reconcile=reconcile, key_retention=timedelta(days=1)
    )
    _refund_call_of_this_test[:] = [(gateway, made)]
    return made


def _charge(ctx: ExecutionContext, call: OutboundCall, order: str, amount: int = 1000) -> Any:
    """A charge the body makes, as ``PaymentTask.outbound`` makes it (its step noted)."""
    return ctx.outbound(call, {"amount": amount}, business_key=f"order:{order}")


def _charged_with_a_refund(
    shop: Shop, execution_id: str, order: str
) -> tuple[ExecutionContext, OutboundCall, Any]:
    """A delivery of ``execution_id`` charges ``order`` and declares its refund as the
    charge's undo. The delivery (lease held), the call and the receipt."""
    charge = shop.charge_call()
    ctx = shop.start(execution_id)
    receipt = _charge(ctx, charge, order)
    declare_undo(ctx, "refund", {"payment": receipt["id"]})
    return ctx, charge, receipt


def _compensate(ctx: ExecutionContext, functions: UndoFunctions) -> int:
    """What a failed delivery does: the undos in reverse, in an ``UndoContext``."""
    undo_ctx = UndoContext.over(ctx)
    with ctx.fenced() as tx:
        declarations = read_declarations(tx, ctx.settings, ctx.execution_id)

    def call(step: UndoStep) -> None:
        functions[step.name](undo_ctx, step, **step.arguments)

    return run_undos(undo_ctx, declarations, call, cause=FAILURE)


def _refunder(shop: Shop, runs: Counter[str], crash_first: set[str] | None = None) -> Any:
    refund = _refund_call(shop)

    def undo(ctx: UndoContext, step: UndoStep, payment: str) -> None:
        runs[step.name] += 1
        ctx.outbound(refund, {"payment": payment})  # keyed <step key>:compensation
        if crash_first is not None and step.name in crash_first:
            crash_first.discard(step.name)
            raise Crash()  # the refund went through; the done mark was not written

    return undo


def test_s12_a_failure_after_the_charge_is_refunded_once(shop: Shop) -> None:
    runs: Counter[str] = Counter()
    ctx, charge, receipt = _charged_with_a_refund(shop, "exec-1", "1")
    assert _compensate(ctx, {"refund": _refunder(shop, runs)}) == 1
    assert _compensate(ctx, {"refund": _refunder(shop, runs)}) == 0, "done: never again"
    assert runs == {"refund": 1}
    [refund] = shop.gateway.refunds
    assert refund["payment"] == receipt["id"]
    step = business_intent_key(shop.settings, "order:1", charge.name)
    assert refund["idempotency_key"] == business_intent_key(
        shop.settings, compensation_key(step), "fake.refund"
    )
    mark = shop.store.read_effect(f"{step}:compensation")
    assert mark is not None and mark.name == DONE_RECORD


def test_ps10_a_crash_between_the_refund_and_its_mark_replays_the_refund(shop: Shop) -> None:
    runs: Counter[str] = Counter()
    first, _, _ = _charged_with_a_refund(shop, "exec-1", "1")
    with pytest.raises(Crash):
        _compensate(first, {"refund": _refunder(shop, runs, crash_first={"refund"})})
    shop.expire_leases()
    second = shop.start("exec-1")  # the next delivery continues the undo
    assert _compensate(second, {"refund": _refunder(shop, runs)}) == 1
    assert runs == {"refund": 2}, "not marked done: the undo ran again"
    assert len(shop.gateway.refunds) == 1, "its refund was replayed, not sent again"


def _two_undone_steps(shop: Shop, plain_refund_b: bool) -> tuple[Counter[str], ExecutionContext]:
    """Charges A then B (B's undo a plain, unfenced refund); A's undo crashes once after
    its refund; a second delivery compensates again."""
    charge = shop.charge_call()
    runs: Counter[str] = Counter()
    first = shop.start("exec-2")
    a = _charge(first, charge, "a")
    declare_undo(first, "undo-a", {"payment": a["id"]})
    b = _charge(first, charge, "b")
    declare_undo(first, "undo-b", {"payment": b["id"]})

    def undo_b(ctx: UndoContext, step: UndoStep, payment: str) -> None:
        runs[step.name] += 1
        if plain_refund_b:
            # PS10's "wrong": a plain refund, no key, no intent (a part, so a second fits)
            shop.gateway.refund(payment, None, amount=100)
        else:
            ctx.outbound(_refund_call(shop), {"payment": payment})

    functions = {"undo-b": undo_b, "undo-a": _refunder(shop, runs, crash_first={"undo-a"})}
    with pytest.raises(Crash):
        _compensate(first, functions)
    assert runs == {"undo-b": 1, "undo-a": 1}, "B's undo first (reverse order)"
    shop.expire_leases()
    second = shop.start("exec-2")
    _compensate(second, functions)
    return runs, second


def test_s12b_an_undo_marked_done_is_not_run_again_after_a_crash(shop: Shop) -> None:
    runs, _ = _two_undone_steps(shop, plain_refund_b=True)
    assert runs == {"undo-b": 1, "undo-a": 2}
    assert len(shop.gateway.refunds) == 2, "one refund per charge"


@sqlite_only
def test_s12b_twin_without_the_done_mark_a_plain_refund_is_made_twice(shop: Shop) -> None:
    with sabotage(UNDO_NOT_MARKED_DONE):
        runs, _ = _two_undone_steps(shop, plain_refund_b=True)
    assert runs["undo-b"] == 2
    assert len(shop.gateway.refunds) == 3, "charge B refunded twice"


@sqlite_only
def test_a_superseded_delivery_runs_no_undo(shop: Shop) -> None:
    """The fence refuses a holder past its lease before any undo function runs (design: P5)."""
    runs: Counter[str] = Counter()
    zombie, _, _ = _charged_with_a_refund(shop, "exec-3", "3")
    shop.expire_leases()
    holder = shop.start("exec-3")  # took over: the body goes on there
    with pytest.raises(ExecutionFencedError):
        _compensate(zombie, {"refund": _refunder(shop, runs)})
    assert runs == {} and shop.gateway.refunds == []
    holder.release()


@sqlite_only
def test_a_business_keyed_step_shared_by_two_executions_is_undone_once(shop: Shop) -> None:
    charge = shop.charge_call()
    runs: Counter[str] = Counter()
    executions = [shop.start("exec-a"), shop.start("exec-b")]
    for ctx in executions:  # the second replays the first's charge (one order)
        receipt = _charge(ctx, charge, "9")
        declare_undo(ctx, "refund", {"payment": receipt["id"]})
    assert [_compensate(ctx, {"refund": _refunder(shop, runs)}) for ctx in executions] == [1, 0]
    assert len(shop.gateway.payments) == 1 and len(shop.gateway.refunds) == 1


@sqlite_only
def test_a_declaration_belongs_to_the_last_step_and_is_kept_once(shop: Shop) -> None:
    charge = shop.charge_call()
    ctx = shop.start("exec-4")
    with pytest.raises(ConfigurationError, match="right after"):
        declare_undo(ctx, "refund", {})
    receipt = _charge(ctx, charge, "4")
    first = declare_undo(ctx, "refund", {"payment": receipt["id"]})
    trail_of(ctx).step_undos.clear()  # as a re-run of the body starts counting again
    again = declare_undo(ctx, "refund", {"payment": "another"})
    assert again == first, "a re-run's declaration keeps the stored one"
    with pytest.raises(ConfigurationError, match="JSON"):
        declare_undo(ctx, "refund", {"at": object()})
    ctx.fenced_effect("reserve", lambda conn: 1)
    reserved = declare_undo(ctx, "release", {})
    assert reserved.step_key == f"{shop.settings.tenant}:t:exec-4:reserve"
    with ctx.fenced() as tx:
        assert [d.undo for d in read_declarations(tx, shop.settings, "exec-4")] == [
            "refund",
            "release",
        ]
    with pytest.raises(ConfigurationError, match="of its own"):
        declare_undo(UndoContext.over(ctx), "refund", {})
    ctx.release()


@sqlite_only
def test_a_redelivered_body_finds_its_declarations_where_it_left_them(shop: Shop) -> None:
    """A crash after the declaration: the next delivery's replayed step declares again
    and the stored list does not grow."""
    charge = shop.charge_call(key_retention=DAY)
    first = shop.start("exec-5")
    declare_undo_after = _charge(first, charge, "5")
    declare_undo(first, "refund", {"payment": declare_undo_after["id"]})
    shop.expire_leases()
    second = shop.start("exec-5")
    receipt = _charge(second, charge, "5")  # replayed
    declare_undo(second, "refund", {"payment": receipt["id"]})
    with second.fenced() as tx:
        assert len(read_declarations(tx, shop.settings, "exec-5")) == 1
    second.release()


@sqlite_only
def test_a_signature_is_declared_as_its_parts_which_its_undo_step_carries(shop: Shop) -> None:
    """What ``undo_with(signature)`` stores: the task's name and JSON parts, which survive
    the crash of the delivery that declared them; its undo step carries them (to the
    Celery layer's runner), and it is marked done like any undo."""
    charge = shop.charge_call()
    first = shop.start("exec-6")
    receipt = _charge(first, charge, "6")
    parts = {
        "task": "shop.refund_payment",
        "args": [receipt["id"]],
        "kwargs": {"amount": 400},
        "options": {"queue": "refunds"},
    }
    with pytest.raises(ConfigurationError, match="its own arguments"):
        declare_undo(first, "shop.refund_payment", {"amount": 1}, task=parts)
    with pytest.raises(ConfigurationError, match="a signature's parts"):
        declare_undo(first, "shop.refund_payment", {}, task={**parts, "args": "x"})
    declare_undo(first, "shop.refund_payment", {}, task=parts)
    shop.expire_leases()
    second = shop.start("exec-6")
    with second.fenced() as tx:
        [declared] = read_declarations(tx, shop.settings, "exec-6")
    assert (declared.undo, declared.task, declared.arguments) == ("shop.refund_payment", parts, {})
    handed: list[UndoStep] = []
    functions = {"shop.refund_payment": lambda ctx, step: handed.append(step)}
    assert _compensate(second, functions) == 1
    assert [(step.task, step.key) for step in handed] == [(parts, declared.key)]
    mark = shop.store.read_effect(declared.key)
    assert mark is not None and mark.name == DONE_RECORD
