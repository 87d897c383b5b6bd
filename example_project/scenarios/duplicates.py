"""Duplicates the application makes (design: PS7, PS8, PS9, PS22) and the gateway's side of keys
(design: PS18, PS19, PS20, PS23): one order charged, captured, refunded or settled from two places.

Every count is taken at the gateway (``world.fake``: its payments, refunds and requests,
and the server's ``charges_seen``, which records every charge that reached it, declined
or not); the shop's ledger only adds what the gateway cannot see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from celery import group

from celery_agboss.delivery.outcomes import decode_result
from celery_agboss.testing.gateway_server import ChargeSeen, HeldAnswer
from celery_agboss.testing.gateway_types import GatewayRequest, GatewayRequestOutcome
from example_project.scenarios.catalog import Outcome, Say, charges, plural, scenario
from example_project.scenarios.world import ScenarioFailed, World

SHOP = "example_project.shop."
ASSISTANT = "example_project.assistant."
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED", "WAITING_OPERATOR", "PARKED")
PROCESSED = GatewayRequestOutcome.PROCESSED
REFUSED = GatewayRequestOutcome.INVALID
IN_FLIGHT = GatewayRequestOutcome.IN_PROGRESS


# --- helpers ------------------------------------------------------------------------------


def _ended(world: World, *task_ids: str, timeout: float = 30.0) -> list[str]:
    """Until each execution is terminal or visibly waiting; their states."""
    return [world.wait_state(task_id, *ENDED, timeout=timeout) for task_id in task_ids]


def _result(world: World, task_id: str) -> Any:
    record = world.execution(task_id)
    return None if record is None else decode_result(record.result)


def _seen(world: World, order_id: str) -> list[ChargeSeen]:
    """Every charge request for the order that reached the gateway, declined or not."""
    assert world.gateway is not None
    return [seen for seen in world.gateway.charges_seen if seen.reference == order_id]


def _answered(requests: Iterable[GatewayRequest]) -> list[GatewayRequest]:
    return [r for r in requests if r.outcome is not GatewayRequestOutcome.ON_THE_WIRE]


def _until(world: World, predicate: Callable[[], Any], timeout: float, what: str) -> bool:
    """Like ``world.wait``, for an outcome that may rightly not happen: False, not a failure."""
    try:
        world.wait(predicate, timeout, what)
    except ScenarioFailed:
        return False
    return True


def _row(world: World, order_id: str) -> dict[str, Any]:
    from example_project import orders

    with world.shop.agboss.store.engine.connect() as conn:
        return orders.load(conn, order_id)


def _reconciled_by(world: World, task_id: str) -> str | None:
    """Who found the execution's pending charge at the gateway ("holder" or "sweep"), read
    from its intents' history (what ``celery -A … agboss describe`` prints); None if nobody."""
    from celery_agboss.operator import describe

    for rows in describe(world.shop.app, task_id).history.values():
        for row in rows:
            if row.event == "reconciled-completed":
                detail = row.detail if isinstance(row.detail, dict) else {}
                return str(detail.get("by") or "?")
    return None


def _fake_id(payment_intent: str) -> str:
    """The fake gateway's id behind a PaymentIntent id (its dialect maps ch_x to pi_x)."""
    return "ch_" + payment_intent.removeprefix("pi_")


def _intent_id(fake_id: str) -> str:
    return "pi_" + fake_id.removeprefix("ch_")


def _hold(world: World, order_id: str | None = None) -> HeldAnswer:
    """The next charge's answer held (for ``order_id`` only, when given: a late charge of an
    earlier scenario must not take the hold)."""
    assert world.gateway is not None
    return world.gateway.hold_next_answer(timeout=20, reference=order_id)


def _unhold(world: World, held: HeldAnswer) -> None:
    """Leave no hold behind: disarmed if no charge reached it, else its answer let go."""
    assert world.gateway is not None
    world.gateway.cancel_hold(held)
    held.release()


def _one_waiting(world: World, task_ids: Iterable[str], what: str) -> str:
    ids = list(task_ids)
    return world.wait(lambda: next((t for t in ids if world.state(t) == "WAITING"), None), 20, what)


def _authorize(world: World, order_id: str, protected: bool) -> str:
    """Authorise the order (its PaymentIntent id), through the column's own task."""
    if protected:
        task_id = world.publish(SHOP + "authorize_order", order_id)
        world.wait_state(task_id, "COMPLETED", timeout=20)
    else:
        world.publish("plain.authorize_order", order_id)
        world.wait(lambda: world.status(order_id) == "authorized", 20, f"{order_id} authorised")
    return str(_row(world, order_id)["payment_id"])


# --- PS7 ----------------------------------------------------------------------------------

TOOL_CALLS = [
    {"tool": "charge", "amount": 1000},
    {"tool": "charge", "amount": 1000},
    {"tool": "charge", "amount": 1500},
]


@scenario("ps7", "The model calls the charge tool twice")
def ps7(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps7", 1000)
    say("one assistant loop: the model calls charge(1000), charge(1000) again, then charge(1500)")
    if not protected:
        world.publish("plain.assistant_session", order_id, TOOL_CALLS)
        world.wait(lambda: world.count(order_id, "paid") >= 3, 30, "the three tool calls")
        payments = len(world.payments(order_id))
        say(f"each tool call charged: the gateway made {charges(payments)}")
        return Outcome(charges(payments), payments > 1)
    task_id = world.publish(ASSISTANT + "assistant_session", order_id, TOOL_CALLS)
    state = world.wait_state(task_id, *ENDED)
    transcript = _result(world, task_id) or []
    for call in transcript:
        say(f"tool call {call}")
    payments, sent = len(world.payments(order_id)), len(_seen(world, order_id))
    outcomes = [
        call.get("outcome") or ("refused" if "refused" in call else None) for call in transcript
    ]
    say(f"the gateway received {plural(sent, 'charge request')} and made {charges(payments)}")
    held = state == "COMPLETED" and payments == 1 and sent == 1
    held = held and outcomes == ["SENT", "REPLAYED", "refused"]
    text = f"{charges(payments)}: the 2nd call replayed, the 3rd (another amount) refused, unsent"
    return Outcome(text, held)


# --- PS8 ----------------------------------------------------------------------------------


@scenario("ps8", "Two executions for one order")
def ps8(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps8")
    task = SHOP + "charge_order" if protected else "plain.charge_order"
    held = _hold(world, order_id)
    try:
        ids = [world.publish(task, order_id), world.publish(task, order_id)]
        say(f"a double click: two executions of one order ({ids[0][:8]}…, {ids[1][:8]}…)")
        world.wait(lambda: held.reached, 20, "the first charge to reach the gateway")
        say("the first execution's charge is made; its answer is held at the gateway")
        if protected:
            second = _one_waiting(world, ids, "the other execution to find the charge in flight")
            say(f"{second[:8]}… found the intent pending under a live lease: in flight, it waits")
        else:
            world.wait(lambda: len(_seen(world, order_id)) >= 2, 20, "the second charge")
            say("the second execution charged under a key of its own")
    finally:
        _unhold(world, held)
    if not protected:
        world.wait(lambda: world.count(order_id, "paid") >= 2, 20, "both to mark the order paid")
        payments = len(world.payments(order_id))
        return Outcome(charges(payments), payments > 1)
    states = _ended(world, *ids)
    receipts = {(_result(world, t) or {}).get("id") for t in ids}
    payments, sent = len(world.payments(order_id)), len(_seen(world, order_id))
    say(f"both {'/'.join(states)} with one receipt; {plural(sent, 'charge request')} sent")
    held_up = states == ["COMPLETED"] * 2 and len(receipts) == 1 and payments == 1 and sent == 1
    return Outcome(f"{charges(payments)}: the 2nd waited (in flight), then replayed", held_up)


# --- PS9 ----------------------------------------------------------------------------------


def _branches(world: World, name: str, args: Iterable[tuple[Any, ...]]) -> list[str]:
    """A Celery group of ``name`` over ``args``: one execution per branch, published at once."""
    signatures = [world.shop.app.signature(name, args=a) for a in args]
    return [str(r.id) for r in group(signatures).apply_async().results]


def _budget(world: World, customer: str, amount: int) -> None:
    from sqlalchemy import insert

    from example_project.assistant import budgets

    engine = world.shop.agboss.store.engine
    budgets.create(engine, checkfirst=True)  # the demo's own table; migrate makes it too
    with engine.begin() as conn:
        conn.execute(insert(budgets).values(customer=customer, remaining=amount))


def _remaining(world: World, customer: str) -> int:
    from sqlalchemy import select

    from example_project.assistant import budgets

    with world.shop.agboss.store.engine.connect() as conn:
        query = select(budgets.c.remaining).where(budgets.c.customer == customer)
        return int(conn.execute(query).scalar_one())


@scenario("ps9", "Parallel branches charging one aggregate")
def ps9(world: World, protected: bool, say: Say) -> Outcome:
    # 1. The same charge made by two branches.
    order_id = world.order("ps9")
    name = ASSISTANT + "ship_part" if protected else "plain.ship_part"
    held = _hold(world, order_id)
    try:
        ids = _branches(world, name, [(order_id, "a"), (order_id, "b")])
        say("a Celery group: branches a and b ship their parts; each makes sure the order is paid")
        world.wait(lambda: held.reached, 20, "a branch's charge to reach the gateway")
        if protected:
            other = _one_waiting(world, ids, "the other branch to find the charge in flight")
            say(f"branch {'ab'[ids.index(other)]} found the order's charge in flight: it waits")
        else:
            world.wait(lambda: len(_seen(world, order_id)) >= 2, 20, "the other branch's charge")
            say("the other branch saw the order unpaid (the first answer not back yet): charged")
    finally:
        _unhold(world, held)
    if protected:
        states = _ended(world, *ids)
    else:
        states = []
        world.wait(lambda: world.count(order_id, "shipped") >= 2, 20, "both parts shipped")
    payments, shipped = len(world.payments(order_id)), world.count(order_id, "shipped")
    say(f"the gateway made {charges(payments)}; {plural(shipped, 'part')} shipped")

    # 2. Two distinct charges (600 each) against one budget of 1000.
    customer = f"customer-{order_id}"
    _budget(world, customer, 1000)
    spends = [world.order("ps9-budget", 600), world.order("ps9-budget", 600)]
    name = ASSISTANT + "spend_budget" if protected else "plain.spend_budget"
    held = _hold(world)
    try:
        spent = _branches(world, name, [(o, customer) for o in spends])
        say("two branches charge two orders of 600 against the customer's budget of 1000")
        world.wait(lambda: held.reached, 20, "a branch's charge to reach the gateway")
        if protected:
            other = spent[1 - spends.index(str(held.reference))]
            world.wait_state(other, *ENDED, timeout=20)
            say(f"the other branch: {_result(world, other)}")
        else:
            world.wait(
                lambda: sum(len(_seen(world, o)) for o in spends) >= 2,
                20,
                "the other branch's charge",
            )
            say("the other branch read the budget before the first drew it: charged too")
    finally:
        _unhold(world, held)
    if protected:
        states += _ended(world, *spent)
    else:
        world.wait(
            lambda: sum(world.count(o, "paid") for o in spends) >= 2,
            20,
            "both branches to mark their orders paid",
        )
    charged = sum(p["amount"] for o in spends for p in world.payments(o))
    remaining = _remaining(world, customer)
    say(f"charged {charged} against the budget of 1000; the budget row says {remaining} left")
    if not protected:
        text = f"{charges(payments)} for 2 branches; {charged} charged on a budget of 1000"
        return Outcome(text, payments > 1 or charged > 1000)
    sent = len(_seen(world, order_id))
    ok = states == ["COMPLETED"] * 4 and payments == 1 and sent == 1 and shipped == 2
    ok = ok and charged == 600 and remaining == 400
    text = f"{charges(payments)} for 2 branches; {charged} on a 1000 budget (its row refused 600)"
    return Outcome(text, ok)


# --- PS18 ---------------------------------------------------------------------------------


@scenario("ps18", "A partial capture")
def ps18(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps18", 1000)
    payment_id = _authorize(world, order_id, protected)
    fake = _fake_id(payment_id)
    say(f"1000 authorised ({payment_id}); shipment 1 (600) ships: its capture task runs twice")
    task = SHOP + "capture_shipment" if protected else "plain.capture_shipment"
    ids = [world.publish(task, order_id, 1, 600) for _ in range(2)]
    if protected:
        states = _ended(world, *ids)
    else:
        states = []
        world.wait(
            lambda: len(_answered(world.requests("capture", {fake}))) >= 2, 20, "both captures"
        )
    requests = world.requests("capture", {fake})
    processed = sum(1 for r in requests if r.outcome is PROCESSED)
    refused = sum(1 for r in requests if r.outcome is REFUSED)
    captured = world.fake.retrieve(fake)["amount_captured"]
    say(
        f"the gateway got {plural(len(requests), 'capture request')}: {processed} processed, "
        f"{refused} refused; {captured} captured"
    )
    if not protected:
        sent = plural(len(requests), "capture request")
        text = f"{sent}: Stripe refused {refused} (it captures a PaymentIntent once)"
        return Outcome(text, len(requests) > 1)
    # The boundary: Stripe captures a PaymentIntent once; a second shipment is refused there.
    second = world.publish(task, order_id, 2, 400)
    (second_state,) = _ended(world, second)
    say(f"shipment 2 (400) on the same PaymentIntent: {second_state} (Stripe captures it once)")
    ok = states == ["COMPLETED"] * 2 and processed == 1 and len(requests) == 1
    ok = ok and world.count(order_id, "captured") == 1
    return Outcome(f"1 capture request for shipment 1 ({plural(processed, 'capture')})", ok)


# --- PS19 ---------------------------------------------------------------------------------


@scenario("ps19", "A refund retried")
def ps19(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps19", 1000, sku="ps19-sold-out")
    saga = world.publish(SHOP + "place_order" if protected else "plain.place_order", order_id)
    payment = world.wait(lambda: world.payments(order_id), 20, "the saga's charge")[0]
    fake, payment_id = payment["id"], _intent_id(payment["id"])
    say(f"the saga charged {payment_id}; the mug is sold out, so its undo refunds it")
    task = ASSISTANT + "refund_payment" if protected else "plain.refund_payment"
    ids = [world.publish(task, order_id, payment_id, by) for by in ("operator", "customer")]
    say("meanwhile the operator and the customer each ask to refund the same payment")
    if protected:
        states = _ended(world, saga, *ids)
        say(f"the saga {states[0]}; the operator's refund {states[1]}, the customer's {states[2]}")
    else:
        world.wait(
            lambda: len(_answered(world.requests("refund", {fake}))) >= 3, 20, "the three refunds"
        )
    requests = world.requests("refund", {fake})
    keys = {r.idempotency_key for r in requests}
    refunds = [r for r in world.fake.refunds if r["payment"] == fake]
    refused = sum(1 for r in requests if r.outcome is REFUSED)
    sent = f"{plural(len(requests), 'refund request')} under {plural(len(keys), 'key')}"
    say(f"the gateway got {sent}: {plural(len(refunds), 'refund')}, {refused} refused")
    if not protected:
        text = (
            f"{plural(len(requests), 'refund request')}, {plural(len(keys), 'key')}: "
            f"{plural(len(refunds), 'refund')}, {refused} refused by Stripe (already refunded)"
        )
        return Outcome(text, len(keys) > 1)
    ok = states == ["FAILED", "COMPLETED", "COMPLETED"] and len(refunds) == 1
    ok = ok and len(requests) == 1 and world.count(order_id, "refunded") == 1
    return Outcome(f"{plural(len(refunds), 'refund')}, 1 request: 3 paths, one refund key", ok)


# --- PS20 ---------------------------------------------------------------------------------


@scenario("ps20", "A void and a capture race")
def ps20(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps20", 1000)
    payment_id = _authorize(world, order_id, protected)
    fake = _fake_id(payment_id)
    task = SHOP + "settle_authorization" if protected else "plain.settle_authorization"
    capture = world.publish(task, order_id, "capture")
    void = world.publish(task, order_id, "void")
    say(f"{payment_id} authorised; fulfilment captures it while the customer cancels (void)")
    if protected:
        states = _ended(world, capture, void)
    else:
        states = []

        def both() -> bool:
            sent = world.requests("capture", {fake}) + world.requests("void", {fake})
            return len(_answered(sent)) >= 2

        world.wait(both, 20, "the capture and the void to be answered")
    captures = world.requests("capture", {fake})
    voids = world.requests("void", {fake})
    refunds = [r for r in world.fake.refunds if r["payment"] == fake]
    captured = any(r.outcome is PROCESSED for r in captures)
    voided = any(r.outcome is PROCESSED for r in voids)
    refused = [r.operation for r in captures + voids if r.outcome is REFUSED]
    sent = f"{plural(len(captures), 'capture request')}, {plural(len(voids), 'void request')}"
    shown = "refused: " + ", ".join(refused) if refused else "none refused"
    say(f"the gateway: {sent} ({shown}), {plural(len(refunds), 'refund')}")
    if not protected:
        row = world.status(order_id)
        loser = "cancel (void)" if captured else "capture"
        say(f"the plain {loser} task raised Stripe's error; the shop's order says {row!r}")
        believed = "captured, the cancel failed, never refunded" if captured else "voided"
        text = f"both sent, Stripe refused the {refused[0] if refused else '-'}: order {believed}"
        return Outcome(text, len(captures) + len(voids) > 1 and bool(refused))
    results = [_result(world, capture) or {}, _result(world, void) or {}]
    say(f"capture's execution: {results[0]}; void's: {results[1]}")
    if captured:
        ok = not voided and len(refunds) == 1 and len(voids) == 0
        text = "capture won: 1 capture, the cancel became 1 refund, no void sent"
    else:
        ok = voided and len(captures) == 0 and not refunds
        text = "void won: 1 void, the capture stood down, nothing captured"
    ok = ok and states == ["COMPLETED"] * 2 and not refused and len(captures) <= 1
    return Outcome(text, ok)


# --- PS22 ---------------------------------------------------------------------------------


@scenario("ps22", "A retry with another card after a decline")
def ps22(world: World, protected: bool, say: Say) -> Outcome:
    pay = ASSISTANT + "pay_attempt" if protected else "plain.pay_attempt"
    retry = ASSISTANT + "retry_with_card" if protected else "plain.retry_with_card"

    # 1. A decline, then another card: attempt 2 is a new key, and one charge.
    declined = world.order("ps22-declined", 1000, card="tok_chargeDeclined")
    first = world.publish(pay, declined)
    if protected:
        world.wait_state(first, "COMPLETED", timeout=20)
    else:
        world.wait(lambda: world.count(declined, "declined") >= 1, 20, "the decline")
    again = world.publish(retry, declined, "pm_card_visa")
    if protected:
        world.wait_state(again, *ENDED, timeout=20)
    else:
        world.wait(lambda: world.status(declined) == "paid", 20, "the other card's charge")
    after_decline = len(world.payments(declined))
    say(
        f"card declined (attempt 1), the customer's other card: attempt "
        f"{_row(world, declined)['attempt']}, {charges(after_decline)}"
    )

    # 2. The answer of attempt 1 lost, then another card: never a new attempt.
    unknown = world.order("ps22-unknown", 1000)
    held = _hold(world, unknown)
    try:
        paying = world.publish(pay, unknown)
        world.wait(lambda: held.reached, 20, "attempt 1's charge to reach the gateway")
        say("attempt 1 is charged, its answer held: the customer's page times out")
        retrying = world.publish(retry, unknown, "pm_card_mastercard")
        if protected:
            world.wait_state(retrying, "COMPLETED", timeout=20)
            say(f"the customer tries another card: {_result(world, retrying)}")
            assert held.pid is not None
            say(f"the sender of attempt 1, pool process {held.pid}: SIGKILL (its answer is lost)")
            world.kill(held.pid)
        else:
            world.wait(lambda: len(world.payments(unknown)) >= 2, 20, "the other card's charge")
            say("the customer tries another card: plain code charges it (a new key)")
    finally:
        _unhold(world, held)
    if protected:
        state = world.wait_state(paying, *ENDED, timeout=30)
        say(f"attempt 1's execution, taken over: {state} {_result(world, paying)}")
    else:
        world.wait(lambda: world.count(unknown, "paid") >= 2, 20, "both attempts marked paid")
    after_unknown = len(world.payments(unknown))
    say(f"after the unknown outcome the gateway made {charges(after_unknown)}")
    if not protected:
        text = f"decline: {charges(after_decline)}; unknown: {charges(after_unknown)}"
        return Outcome(text, after_unknown > 1)
    refused = "refused" in (_result(world, retrying) or {})
    by = _reconciled_by(world, paying)
    say(f"attempt 1's pending charge was found at the gateway by the {by}: nothing resent")
    ok = after_decline == 1 and after_unknown == 1 and refused and by is not None
    text = (
        f"decline: {charges(after_decline)} (attempt 2); unknown: no new attempt, "
        f"attempt 1 reconciled: {charges(after_unknown)}"
    )
    return Outcome(text, ok)


# --- PS23 ---------------------------------------------------------------------------------


@scenario("ps23", "Two requests under one key at once")
def ps23(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps23")
    task = SHOP + "charge_order" if protected else "plain.charge_order_keyed"
    hold = world.fake.hold(before_processing=True, operation="charge", timeout=20)
    try:
        ids = [world.publish(task, order_id), world.publish(task, order_id)]
        world.wait(lambda: hold.reached, 20, "the first request to reach the gateway")
        key = _seen(world, order_id)[0].idempotency_key or ""
        say(f"two executions of one order; the first request is on the wire (key {key[-40:]})")
        if protected:
            _one_waiting(world, ids, "the second execution to find the attempt claimed")
            say("the second execution found the attempt claimed under a live lease: sent nothing")
        else:
            world.wait(
                lambda: any(r.outcome is IN_FLIGHT for r in world.fake.requests_for(key)),
                20,
                "the second sender's request under the same key",
            )
            say("the second sender's request under the same key: Stripe answered 409 (in flight)")
    finally:
        hold.release()
    if protected:
        states = _ended(world, *ids)
    else:
        states = []
        _until(world, lambda: world.count(order_id, "paid") >= 2, 10, "the retried sender")
    requests = world.fake.requests_for(key)
    shown = ", ".join(r.outcome.value.lower() for r in requests)
    payments = len(world.payments(order_id))
    say(f"requests under the key: {len(requests)} ({shown}); {charges(payments)}")
    if not protected:
        paid = world.count(order_id, "paid")
        text = (
            f"{plural(len(requests), 'request')} under one key (409 in flight to the 2nd): "
            f"{charges(payments)}, marked paid {paid}x"
        )
        return Outcome(text, len(requests) > 1)
    ok = states == ["COMPLETED"] * 2 and len(requests) == 1 and payments == 1
    return Outcome(f"1 request under the key, {charges(payments)}", ok)
