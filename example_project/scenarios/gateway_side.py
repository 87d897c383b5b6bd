"""The gateway's side: lost answers, support levels, webhooks, key retention and 3-D Secure.

PS1, PS15, PS16, PS17 and PS21 run on the real workers and, for webhooks and the return
page, through the shop's HTTP entry point (``python -m example_project.web``), every
webhook signed as Stripe signs it. PS6 compares three gateways that offer less than
Stripe; the scenario runs in this process, against in-memory ``FakeGateway``s at three
capability levels, and says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import stripe as stripe_sdk
from sqlalchemy import update

from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.outbound import CallContext, Completed, Lookup, NotSent, OutboundCall
from celery_agboss.core.outbound import Unknown as UnknownAnswer
from celery_agboss.errors import OutboundCallOutcomeUnknownError, OutboundCallUnreconciledError
from celery_agboss.store.schema import outbound_calls
from celery_agboss.testing import (
    FakeGateway,
    FakeGatewayFault,
    FakeGatewayTimeout,
    GatewayCapabilities,
    VirtualClock,
    arm_raise,
    disarm_all,
    gateway_checklist,
    is_definite_failure,
)
from celery_agboss.testing.fault_arming import OUTBOUND_AFTER_SEND
from celery_agboss.testing.stores import open_store, sqlite_store_url
from celery_agboss.webhooks import STRIPE_SIGNATURE_HEADER, sign_stripe
from example_project import config, orders
from example_project.scenarios.catalog import Outcome, Say, charges, plural, scenario
from example_project.scenarios.sagas import _cli, _finish
from example_project.scenarios.world import World

CHARGE = "example_project.shop.charge_order"
PLAIN_CHARGE = "plain.charge_order"
PLAIN_CHARGE_WITH_KEY = "plain.charge_order_keyed"
PLAIN_HANDLE_EVENT = "plain.handle_stripe_event"
PLAIN_CHECKOUT_3DS = "plain.checkout_3ds"
PLAIN_FINISH_3DS = "plain.finish_3ds"
DAY = timedelta(days=1)
KEY_AGE = timedelta(hours=25)  # past Stripe's documented 24 h


# --- helpers: the order's requests at the gateway, Stripe objects, webhooks -----------------


def _keyed_requests(world: World, operation: str, order_id: str) -> list[Any]:
    """Requests of ``operation`` sent under one of the order's business keys."""
    return [r for r in world.requests(operation) if order_id in (r.idempotency_key or "")]


def _payment_id(world: World, order_id: str) -> str:
    with world.shop.agboss.store.engine.connect() as conn:
        return str(orders.load(conn, order_id)["payment_id"])


def _customer_pays(order_id: str) -> Any:
    """The customer pays at Stripe (its hosted page, say): one PaymentIntent for the order,
    made as the plain shop makes one, under the checkout page's key; the shop's checkout
    page created it, so it names the order as the shop's own (``shop.SHOP_CHARGE``)."""
    from example_project.shop import SHOP_CHARGE  # imports the shop: lazily
    from example_project.unprotected import create_intent, read

    marked = {SHOP_CHARGE: order_id}
    return create_intent(read(order_id), key=f"checkout:{order_id}", metadata=marked)


def _event(kind: str, data_object: dict[str, Any]) -> dict[str, Any]:
    """A Stripe event as its webhook carries it (``id`` is what a redelivery repeats)."""
    return {
        "id": f"evt_{uuid.uuid4().hex[:24]}",
        "object": "event",
        "created": int(time.time()),
        "livemode": False,
        "type": kind,
        "data": {"object": data_object},
    }


def _intent_object(intent_id: str, order_id: str, status: str) -> dict[str, Any]:
    return {
        "id": intent_id,
        "object": "payment_intent",
        "status": status,
        "metadata": {"reference": order_id},
    }


def _charge_object(intent_id: str, order_id: str) -> dict[str, Any]:
    return {
        "id": "ch_" + intent_id.removeprefix("pi_"),
        "object": "charge",
        "payment_intent": intent_id,
        "refunded": True,
        "metadata": {"reference": order_id},
    }


def _signed(event: dict[str, Any], secret: str | None = None) -> tuple[bytes, str]:
    body = json.dumps(event).encode()
    return body, sign_stripe(body, secret or config.stripe_webhook_secret())


def _http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=15) as answer:
            return int(answer.status), json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as refused:
        return int(refused.code), json.loads(refused.read() or b"null")


def _post_webhook(url: str, event: dict[str, Any], secret: str | None = None) -> tuple[int, Any]:
    """POST the event to the shop's webhook endpoint, signed as Stripe signs it."""
    body, signature = _signed(event, secret)
    headers = {"Content-Type": "application/json", STRIPE_SIGNATURE_HEADER: signature}
    return _http("POST", url + "/webhooks/stripe", body, headers)


def _at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls in threads released together; their results, in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int, fn: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = fn()
        except BaseException as exc:  # re-raised below, in the runner's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(i, fn), daemon=True) for i, fn in enumerate(calls)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if errors:
        raise errors[0]
    if any(thread.is_alive() for thread in threads):
        raise TimeoutError("a request made at once did not finish in 30 s")
    return results


def _finished(world: World, task_id: str) -> None:
    """Until the task's execution completed; a failed one stops the scenario, saying why."""
    if world.wait_state(task_id, "COMPLETED", "FAILED", timeout=30) == "FAILED":
        raise RuntimeError(f"{task_id} failed: see the workers' logs")


def _plain_endpoint(world: World, event: dict[str, Any], secret: str | None = None) -> str:
    """What a plain Celery app's webhook view does: check the signature with the SDK, then
    publish the handler for the delivery. A forged event raises here, as it should."""
    body, signature = _signed(event, secret)
    verified = stripe_sdk.Webhook.construct_event(
        body.decode(), signature, config.stripe_webhook_secret()
    )
    message = {"event_id": verified["id"], "type": verified["type"], "payload": json.loads(body)}
    return world.publish(PLAIN_HANDLE_EVENT, message)


# --- PS1 ------------------------------------------------------------------------------------


@scenario("ps1", "A retry after a timeout")
def ps1(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps1")
    world.fake.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP, operation="charge")
    try:
        task_id = world.publish(CHARGE if protected else PLAIN_CHARGE, order_id)
        world.wait(lambda: world.payments(order_id), 30, "the charge to reach the gateway")
        say("the gateway charged; its answer was lost (the connection closed, no response)")
        if protected:
            world.wait_state(task_id, "COMPLETED", timeout=30)
        world.wait(lambda: world.status(order_id) == "paid", 30, f"{order_id} to be paid")
    finally:
        world.fake.clear_faults()
    payments, paid = len(world.payments(order_id)), world.count(order_id, "paid")
    say(f"the gateway made {charges(payments)}; the order was marked paid {paid}x")
    if protected:
        sent = len(_keyed_requests(world, "charge", order_id))
        say(f"requests under the order's key: {sent} (the retry searched Stripe, sent nothing)")
        ok = payments == 1 and paid == 1 and sent == 1
        return Outcome(f"{charges(payments)}, unknown outcome reconciled by search", ok)
    return Outcome(f"{charges(payments)} (the retry's new SDK key)", payments > 1)


# --- PS6 ------------------------------------------------------------------------------------

LEVELS = (
    ("full", GatewayCapabilities.FULL),
    ("no lookup", GatewayCapabilities.NO_LOOKUP),
    ("no keys", GatewayCapabilities.NO_KEYS),
)
CASES = ("timeout", "crash", "late")
# PS6's table (design: PS6): (level, case) -> (payments, an operator decides). Without keys the
# stub's adapter can only replay after a timeout (a new charge) and only say Unknown after
# a crash; its late replay claims absence (a new charge). The plain column resends under
# one key, with no intent: what the gateway's own key alone can do.
SEED_TABLE = {
    ("full", "timeout"): (1, False),
    ("full", "crash"): (1, False),
    ("full", "late"): (1, False),
    ("no lookup", "timeout"): (1, False),
    ("no lookup", "crash"): (1, False),
    ("no lookup", "late"): (1, True),
    ("no keys", "timeout"): (2, False),
    ("no keys", "crash"): (1, True),
    ("no keys", "late"): (2, False),
}


class _Crash(BaseException):
    """The delivery died here (SIGKILL): nothing after it runs, its lease is left to expire."""


def _level_call(gateway: FakeGateway, level: str, case: str, name: str) -> OutboundCall:
    """The adapter a team writes for a gateway of this level."""

    def send(call: CallContext) -> Any:
        return gateway.charge(call.request["amount"], call.idempotency_key)

    def by_lookup(call: CallContext, lookup: Lookup) -> Any:
        found = gateway.lookup(lookup.idempotency_key)
        return NotSent() if found is None else Completed(found)

    def by_replay(call: CallContext, lookup: Lookup) -> Any:
        return NotSent()  # no lookup: let the gateway replay its key (while it keeps it)

    def unknown(call: CallContext, lookup: Lookup) -> Any:
        return UnknownAnswer("no lookup and no keys: nothing can tell")

    retention: timedelta | None = DAY
    absence = False
    reconcile: Callable[[CallContext, Lookup], Any] = by_replay
    if level == "full":
        reconcile = by_lookup
    elif level == "no keys" and case == "crash":
        reconcile = unknown
    elif level == "no keys" and case == "late":
        retention, absence = None, True  # an adapter that claims its guess proves absence
    return OutboundCall(
        name=name,
        send=send,
        reconcile=reconcile,
        is_definite_failure=is_definite_failure,
        key_retention=retention,
        lookup_proves_absence=absence,
    )


def _engine_cell(
    store: Any, settings: EngineSettings, clock: VirtualClock, level: str, case: str
) -> tuple[int, bool]:
    """One case on one level through celery_agboss's engine: (payments, waits for a person)."""
    capabilities = dict(LEVELS)[level]
    gateway = FakeGateway(clock=clock, capabilities=capabilities)
    tag = f"{level.replace(' ', '-')}-{case}-{uuid.uuid4().hex[:6]}"
    call = _level_call(gateway, level, case, f"ps6.{tag}")
    execution_id, request = f"ps6-{tag}", {"amount": 700}
    if case == "crash":
        first = ExecutionContext.start(store, execution_id, settings)
        arm_raise(OUTBOUND_AFTER_SEND, _Crash, only={"holder": first.lease_ref.holder})
        with contextlib.suppress(_Crash):  # the pod is gone; its lease expires below
            first.outbound(call, request)
        clock.advance(settings.lease_ttl_ms / 1000 + 1)
    else:
        gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
        # the SDK's error: an unknown outcome, so the intent stays pending
        with (
            ExecutionContext.start(store, execution_id, settings) as first,
            contextlib.suppress(OutboundCallOutcomeUnknownError),
        ):
            first.outbound(call, request)
        if case == "late":
            clock.advance(3 * DAY)
    waits = False
    with ExecutionContext.start(store, execution_id, settings) as second:
        try:
            second.outbound(call, request)
        except OutboundCallUnreconciledError:
            waits = True
    return len(gateway.payments), waits


def _plain_cell(clock: VirtualClock, level: str, case: str) -> tuple[int, bool]:
    """The same case with plain code: resend under one key after the error, no intent."""
    gateway = FakeGateway(clock=clock, capabilities=dict(LEVELS)[level])
    key = f"order:ps6-{uuid.uuid4().hex[:8]}"
    if case == "crash":
        gateway.charge(700, key)  # processed; the worker died before the answer
    else:
        gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
        with contextlib.suppress(FakeGatewayTimeout):
            gateway.charge(700, key)
    if case == "late":
        clock.advance(3 * DAY)
    gateway.charge(700, key)
    return len(gateway.payments), False


def _checklist(level: str) -> str:
    clock = VirtualClock()
    gateway = FakeGateway(clock=clock, capabilities=dict(LEVELS)[level])
    report = gateway_checklist(gateway.charge, gateway.lookup, clock=clock)
    return " ".join(f"{r.requirement} {r.status.value.lower()}" for r in report.results)


@scenario("ps6", "Support levels: full, no lookup, no keys")
def ps6(world: World, protected: bool, say: Say) -> Outcome:
    clock = VirtualClock()
    cells: dict[tuple[str, str], tuple[int, bool]] = {}
    with tempfile.TemporaryDirectory(prefix="ps6-", dir=world.root) as directory:
        store = open_store(sqlite_store_url(directory), clock_offset_source=clock.offset_ms)
        settings = EngineSettings(
            pseudonym_key=config.pseudonym_key().encode(),
            lease_ttl_ms=30_000,
            attempt_timeout_ms=5_000,
        )
        quiet = logging.getLogger("celery_agboss")  # the engine's own log lines, in this process
        level_before = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            for level, _ in LEVELS:
                if protected:
                    say(f"{level}: the checklist says {_checklist(level)}")
                for case in CASES:
                    if protected:
                        cells[(level, case)] = _engine_cell(store, settings, clock, level, case)
                    else:
                        cells[(level, case)] = _plain_cell(clock, level, case)
        finally:
            quiet.setLevel(level_before)
            disarm_all()
            store.close()

    def row(level: str) -> str:
        shown = []
        for case in CASES:
            payments, waits = cells[(level, case)]
            shown.append(f"{payments}{'+operator' if waits else ''}")
        return f"{level} {'/'.join(shown)}"

    for level, _ in LEVELS:
        say(f"{row(level)} (timeout/crash before the answer/late replay: payments)")
    text = "timeout/crash/late: " + "; ".join(row(level) for level, _ in LEVELS)
    simulated = "in-process gateways at three levels"
    if protected:
        return Outcome(text, cells == SEED_TABLE, simulated)
    return Outcome(text, any(payments > 1 for payments, _ in cells.values()), simulated)


# --- PS15 -----------------------------------------------------------------------------------


@scenario("ps15", "A webhook delivered twice")
def ps15(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps15")
    intent = _customer_pays(order_id)
    event = _event("payment_intent.succeeded", _intent_object(intent.id, order_id, "succeeded"))
    forged = _event("charge.refunded", _charge_object(intent.id, order_id))
    entry = f"webhook:{event['type']}"
    if protected:
        url = world.start_web()
        answers = [_post_webhook(url, event), _post_webhook(url, event)]
        answers += _at_once(lambda: _post_webhook(url, event), lambda: _post_webhook(url, event))
        refused, _ = _post_webhook(url, forged, secret="whsec_not_the_shops_secret")
        statuses = [status for status, _ in answers]
        tasks = [task for status, body in answers if status == 200 for task in body["published"]]
        say(f"4 deliveries of {event['id']} (2 one after the other, 2 at once): {statuses}")
        say(f"a forged refund event: HTTP {refused}")
        for task in tasks:
            _finished(world, task)
    else:
        tasks = [_plain_endpoint(world, event), _plain_endpoint(world, event)]
        tasks += _at_once(
            lambda: _plain_endpoint(world, event), lambda: _plain_endpoint(world, event)
        )
        try:
            _plain_endpoint(world, forged, secret="whsec_not_the_shops_secret")
            refused = 200
        except stripe_sdk.SignatureVerificationError:
            refused = 400
        say(f"4 deliveries of {event['id']}, each published by a plain endpoint; forged: {refused}")
        world.wait(lambda: world.count(order_id, entry) >= 4, 30, "the four deliveries applied")
    applied, forged_applied = (
        world.count(order_id, entry),
        world.count(order_id, "webhook:charge.refunded"),
    )
    status = world.status(order_id)
    say(f"applied {applied}x; the forged event recorded {forged_applied}x; the order is {status}")
    if protected:
        ok = applied == 1 and refused == 400 and forged_applied == 0 and status == "paid"
        return Outcome(f"applied once of 4 deliveries; forged one refused ({refused})", ok)
    return Outcome(f"applied {applied}x of 4 deliveries", applied > 1)


def _wait_applied(world: World, order_id: str, entry: str) -> None:
    world.wait(lambda: world.count(order_id, entry) >= 1, 30, f"{entry} applied")


# --- PS16 -----------------------------------------------------------------------------------


@scenario("ps16", "Webhooks out of order")
def ps16(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps16")
    intent = _customer_pays(order_id)
    world.shop.stripe.client.v1.refunds.create(
        params={"payment_intent": intent.id}, options={"idempotency_key": f"refund:{intent.id}:1"}
    )
    refunded = _event("charge.refunded", _charge_object(intent.id, order_id))
    succeeded = _event("payment_intent.succeeded", _intent_object(intent.id, order_id, "succeeded"))
    say("paid, then refunded at Stripe; the refund's event arrives first, the success's after")
    for event in (refunded, succeeded):
        if protected:
            status, body = _post_webhook(world.start_web(), event)
            if status != 200:
                raise RuntimeError(f"the webhook was refused: {status} {body}")
            for task in body["published"]:
                _finished(world, task)
        else:
            _plain_endpoint(world, event)
            _wait_applied(world, order_id, f"webhook:{event['type']}")
    status = world.status(order_id)
    say(f"the order ends {status!r} (Stripe: the payment is refunded)")
    if protected:
        return Outcome(
            f"ends {status!r}: Stripe's status read, moved only forward", status == "refunded"
        )
    return Outcome(f"ends {status!r}: the late success event applied last", status == "paid")


# --- PS17 -----------------------------------------------------------------------------------


def _age_pending_intent(world: World, execution_id: str, by: timedelta) -> int:
    """Move the execution's pending intent's recorded times back by ``by``: its key looks
    that old to every worker (the store's clock decides a key's age). The rows it moved."""
    ms = int(by.total_seconds() * 1000)
    with world.shop.agboss.store.engine.begin() as conn:
        moved = conn.execute(
            update(outbound_calls)
            .where(
                outbound_calls.c.execution_id == execution_id,
                outbound_calls.c.status == "PENDING",
            )
            .values(
                first_attempt_at_ms=outbound_calls.c.first_attempt_at_ms - ms,
                attempt_started_at_ms=outbound_calls.c.attempt_started_at_ms - ms,
            )
        )
        return int(moved.rowcount)


def _pending_listed(world: World, execution_id: str) -> list[dict[str, Any]]:
    """What ``celery -A example_project.shop agboss pending --json`` lists for the execution."""
    ((code, output),) = _finish([_cli(world, "agboss", "pending", "--json")])
    if code != 0:
        raise RuntimeError(f"agboss pending failed ({code}): {output[-500:]}")
    listing = json.loads(output[output.index("{") :])
    return [i for i in listing["pending"] if i["execution_id"] == execution_id]


@scenario("ps17", "The idempotency key expires before a retry")
def ps17(world: World, protected: bool, say: Say) -> Outcome:
    assert world.gateway is not None
    dialect: Any = world.gateway.dialect  # the Stripe dialect: its search lags on demand
    lag = dialect.search_lag
    order_id = world.order("ps17")
    held = world.gateway.hold_next_answer(timeout=30, reference=order_id)
    try:
        if protected:
            dialect.search_lag = 3600.0  # Stripe: search may lag "up to an hour"
        task_id = world.publish(CHARGE if protected else PLAIN_CHARGE_WITH_KEY, order_id)
        world.wait(lambda: held.reached, 30, "the charge to reach the gateway")
        assert held.pid is not None
        say(
            f"the gateway charged; its answer is held; the sender, pool process {held.pid}: SIGKILL"
        )
        world.kill(held.pid)
        world.fake.forget_keys()  # the gateway's 24 h retention has passed
        if protected:
            aged = _age_pending_intent(world, task_id, KEY_AGE)
            say(
                f"the retry comes 25 h later: the intent's recorded times aged ({aged} row), "
                "the gateway's keys forgotten"
            )
        else:
            say("the redelivery comes past Stripe's retention: the fake forgot its keys")
        held.release()
        if protected:
            world.wait_state(task_id, "WAITING_OPERATOR", timeout=40)
            listed = _pending_listed(world, task_id)
        else:
            world.wait(lambda: world.status(order_id) == "paid", 40, f"{order_id} to be paid")
    finally:
        world.gateway.cancel_hold(held)
        held.release()
        dialect.search_lag = lag
    payments = len(world.payments(order_id))
    if protected:
        sent = len(_keyed_requests(world, "charge", order_id))
        flagged = [i for i in listed if i["needs_operator"]]
        say(
            f"requests under the order's key: {sent}; "
            f"`agboss pending` lists {len(flagged)} for an operator"
        )
        reason = flagged[0]["operator_reason"] if flagged else None
        if reason:
            say(f"why: {reason}")
        ok = payments == 1 and sent == 1 and len(flagged) == 1
        text = f"{charges(payments)}, nothing resent; waits for an operator (agboss pending)"
        return Outcome(text, ok, "the key's 25 h age: the intent's times moved back in the store")
    say(f"the gateway made {charges(payments)}")
    return Outcome(
        f"{charges(payments)} (the same key, forgotten)",
        payments > 1,
        "the gateway's 24 h retention: the fake forgot its keys",
    )


# --- PS21 -----------------------------------------------------------------------------------


def _captures(world: World, order_id: str) -> list[Any]:
    ids = {payment["id"] for payment in world.payments(order_id)}
    return [r for r in world.requests("capture", ids) if r.outcome.value == "PROCESSED"]


@scenario("ps21", "A redirect or 3DS flow: the browser retries")
def ps21(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps21")
    if protected:
        url = world.start_web()
        form = json.dumps({"order_id": order_id, "amount": 1000, "flow": "3ds"}).encode()
        headers = {"Content-Type": "application/json"}
        submits = [_http("POST", url + "/orders", form, headers) for _ in range(2)]
        task_id = submits[0][1]["task_id"]
        world.wait_state(task_id, "PAUSED", timeout=30)
        intent_id = _payment_id(world, order_id)
        say(f"the form submitted twice: one execution ({task_id}), paused for 3-D Secure")
        event = _event(
            "payment_intent.amount_capturable_updated",
            _intent_object(intent_id, order_id, "requires_capture"),
        )
        returned, hooked = _at_once(
            lambda: _http("GET", f"{url}/return?order={order_id}"),
            lambda: _post_webhook(url, event),
        )
        answered = returned[1].get("answered")
        say(f"the return page and the webhook at once: the return page answered: {answered}")
        world.wait_state(task_id, "COMPLETED", timeout=30)
        if hooked[0] == 200:
            for task in hooked[1]["published"]:
                _finished(world, task)
    else:
        first = world.publish(PLAIN_CHECKOUT_3DS, order_id)
        second = world.publish(PLAIN_CHECKOUT_3DS, order_id)
        world.wait(lambda: len(world.payments(order_id)) >= 2, 30, "both submits authorised")
        say(
            f"the form submitted twice: two plain tasks ({first[:8]}, {second[:8]}), "
            "each authorising"
        )
        intents = ["pi_" + p["id"].removeprefix("ch_") for p in world.payments(order_id)]
        # the return page (the order's payment) and a webhook per PaymentIntent: the
        # workers run them at the same time
        world.publish(PLAIN_FINISH_3DS, order_id)
        for intent_id in intents:
            world.publish(PLAIN_FINISH_3DS, order_id, intent_id)
        world.wait(lambda: len(_captures(world, order_id)) >= 2, 30, "two captures")
    authorised, captured = len(world.payments(order_id)), len(_captures(world, order_id))
    say(f"the gateway authorised {plural(authorised, 'payment')} and captured {captured}")
    if protected:
        ok = authorised == 1 and captured == 1 and world.count(order_id, "paid") == 1
        return Outcome(f"1 authorisation, {plural(captured, 'capture')}, one answer won", ok)
    return Outcome(f"{charges(captured)} captured", captured > 1)
