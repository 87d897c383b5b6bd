"""Failures of the process: a worker killed, frozen, stopped or cut at the worst moment."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from example_project.scenarios.catalog import Outcome, Say, charges, scenario
from example_project.scenarios.world import SPEED_UPS, World

CHARGE = "example_project.shop.charge_order"
PLAIN_CHARGE = "plain.charge_order"
PLAIN_REDRIVE = "plain.redrive_stuck_orders"
PLAIN_REDRIVE_BY_AGE = "plain.redrive_old_orders"


def _charge_task(protected: bool) -> str:
    return CHARGE if protected else PLAIN_CHARGE


def _settled(
    world: World, order_id: str, task_id: str, protected: bool, timeout: float = 40.0
) -> None:
    """Until the order is paid and nothing of it is still running."""
    if protected:
        world.wait_state(task_id, "COMPLETED", timeout=timeout)
    world.wait(lambda: world.status(order_id) == "paid", timeout, f"{order_id} to be paid")


def _paid_once(world: World, order_id: str, say: Say, protected: bool, how: str) -> Outcome:
    """Counted at the gateway; the order's paid marks and receipts in the shop's ledger
    (the receipt is the follow-up task the outbox publishes once the mark committed)."""
    world.wait(lambda: world.count(order_id, "receipt") >= 1, 30, f"{order_id}'s receipt")
    payments = len(world.payments(order_id))
    paid, receipts = world.count(order_id, "paid"), world.count(order_id, "receipt")
    say(
        f"the gateway made {charges(payments)}; the order was marked paid {paid}x, "
        f"its receipt sent {receipts}x"
    )
    if protected:
        once = payments == 1 and paid == 1 and receipts == 1
        return Outcome(f"{charges(payments)}, {how}", once)
    return Outcome(charges(payments), payments > 1)


@scenario("ps2", "A crash after the charge, before the checkpoint")
def ps2(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps2")
    world.arm("before-mark-paid", order_id)
    task_id = world.publish(_charge_task(protected), order_id)
    (pid,) = world.wait_frozen("before-mark-paid", order_id)
    say(f"the gateway charged; pool process {pid} is about to mark the order paid: SIGKILL")
    world.kill(pid)
    _settled(world, order_id, task_id, protected)
    return _paid_once(world, order_id, say, protected, "replayed from the store")


@scenario("ps5", "A crash after the send, before the answer")
def ps5(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps5")
    task_id, held = _charge_answer_held(world, order_id, protected)
    say(f"the gateway charged; its answer is held; the sender, pool process {held.pid}: SIGKILL")
    world.kill(held.pid)
    held.release()
    _settled(world, order_id, task_id, protected)
    return _paid_once(world, order_id, say, protected, "reconciled")


def _charge_answer_held(world: World, order_id: str, protected: bool) -> tuple[str, Any]:
    """Publish the charge and hold its answer at the gateway (the payment made): the task
    id and the hold, whose ``pid`` is the pool process waiting for the answer."""
    assert world.gateway is not None
    held = world.gateway.hold_next_answer(timeout=30, reference=order_id)
    task_id = world.publish(_charge_task(protected), order_id)
    world.wait(lambda: held.reached and held.pid, 30, "the charge to reach the gateway")
    return task_id, held


def _frozen_mid_charge(world: World, order_id: str, protected: bool) -> tuple[str, int, object]:
    """Publish the charge; freeze (SIGSTOP) the pool process whose charge the gateway
    made, its answer on the wire; the task id, the pid, and the released hold."""
    task_id, held = _charge_answer_held(world, order_id, protected)
    world.stop(held.pid)
    held.release()
    return task_id, held.pid, held


def _plain_redrive(world: World, order_id: str, say: Say) -> None:
    """A plain app finishes orders whose worker vanished with a scheduled job: after a
    lease's worth of waiting, the orders still unpaid are charged again."""
    time.sleep(float(SPEED_UPS["AGBOSS_LEASE_TTL"]))  # the plain job's own "stuck" delay
    say("the plain app's stuck-order job re-publishes the unpaid order")
    world.publish(PLAIN_REDRIVE, [order_id])


def _redriven(
    world: World, order_id: str, task_id: str, protected: bool, say: Say, how: str
) -> None:
    """Until a charge whose worker is gone is finished by someone else: the sweep re-drives
    the protected execution (``how`` tells who finished it); a plain app's stuck-order job
    re-publishes the unpaid order."""
    if protected:
        world.wait_state(task_id, "COMPLETED", timeout=40)
        say(how)
    else:
        _plain_redrive(world, order_id, say)
        world.wait(lambda: world.status(order_id) == "paid", 30, f"{order_id} to be paid")


@scenario("ps3", "A zombie after a takeover")
def ps3(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps3")
    task_id, pid, _ = _frozen_mid_charge(world, order_id, protected)
    say(f"the gateway charged; pool process {pid} frozen (SIGSTOP) before it read the answer")
    try:
        how = "its lease expired; the sweep re-drove the order; another process reconciled it"
        _redriven(world, order_id, task_id, protected, say, how)
    finally:
        world.cont(pid)
    say(f"process {pid} wakes up (SIGCONT) and carries on with its answer")
    if protected:
        world.logged("execution.fenced")
        say("its settle is refused by the fence: it writes and sends nothing")
    else:
        world.wait(lambda: world.count(order_id, "paid") >= 2, 30, "the zombie to mark it paid")
    return _paid_once(world, order_id, say, protected, "the zombie fenced")


@scenario("ps12", "A rolling deploy or a graceful stop mid-payment")
def ps12(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps12")
    task_id, held = _charge_answer_held(world, order_id, protected)
    worker = world.worker_of(held.pid)
    os.kill(worker.pid, signal.SIGTERM)
    say(f"the deploy sends SIGTERM to {worker.name} while its charge is on the wire")
    world.wait(lambda: "Warm shutdown" in worker.output() or not worker.alive(), 10,
               "the warm shutdown to start")  # fmt: skip
    say("the platform's grace (1 s) is shorter than the step: SIGKILL, then the new version starts")
    time.sleep(1.0)
    held.release()
    world.replace_worker(worker)
    how = "the new version's worker continued the order under the same business key"
    _redriven(world, order_id, task_id, protected, say, how)
    return _paid_once(world, order_id, say, protected, "reconciled after the deploy")


@scenario("ps14", "The database lost mid-commit")
def ps14(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps14")
    world.arm("lose-commit-answer", order_id)
    task_id = world.publish(_charge_task(protected), order_id)
    _settled(world, order_id, task_id, protected)
    say("the order's mark-paid committed, and the worker was told the connection was lost")
    if not protected:
        world.wait(lambda: len(world.payments(order_id)) >= 2 or None, 15, "the retry's charge")
    outcome = _paid_once(world, order_id, say, protected, "replayed after the lost commit")
    return Outcome(
        outcome.text, outcome.as_expected,
        simulated="the COMMIT's answer lost: an error raised after a real commit",
    )  # fmt: skip


@scenario("ps4", "The zombie reaches the write first")
def ps4(world: World, protected: bool, say: Say) -> Outcome:
    assert world.gateway is not None
    order_id = world.order("ps4")
    task_id, pid, _ = _frozen_mid_charge(world, order_id, protected)
    say(f"the gateway charged; pool process {pid} frozen (SIGSTOP) before it read the answer")
    try:
        if protected:
            with world.searches_held() as search:
                world.wait(search.is_set, 40, "the new holder to reconcile")
                say("its lease expired; a new holder took over and is looking the charge up")
                world.cont(pid)
                say(f"the zombie {pid} wakes up first and settles its charge at once")
                world.logged("execution.fenced")
                say("refused although it came first: its lease is not the live one")
            world.wait_state(task_id, "COMPLETED", timeout=40)
        else:
            held = world.gateway.hold_next_answer(timeout=30, reference=order_id)
            _plain_redrive(world, order_id, say)
            world.wait(lambda: held.reached, 30, "the second charge to reach the gateway")
            world.cont(pid)
            say(f"the zombie {pid} wakes up first and marks the order paid with its charge")
            world.wait(lambda: world.count(order_id, "paid") >= 1, 30, "the zombie's write")
            held.release()
            world.wait(lambda: world.count(order_id, "paid") >= 2, 30, "the second write")
    finally:
        world.cont(pid)
    return _paid_once(world, order_id, say, protected, "the zombie refused, first or not")


SKEWED_QUEUE = "skewed-host"
SKEW_SECONDS = 3600


def _skewed_worker(world: World) -> None:
    if not any(SKEWED_QUEUE in process.name for process in world.processes):
        world.start_worker(
            concurrency=1, queue=SKEWED_QUEUE, env={"EXAMPLE_CLOCK_AHEAD": str(SKEW_SECONDS)}
        )


@scenario("ps13", "Clock skew and lease expiry")
def ps13(world: World, protected: bool, say: Say) -> Outcome:
    _skewed_worker(world)
    order_id = world.order("ps13")
    hold = world.fake.hold(before_processing=True, operation="charge", timeout=30)
    try:
        task_id = world.publish(_charge_task(protected), order_id)
        world.wait(lambda: hold.reached, 30, "the charge to reach the gateway")
        say("the charge is on the wire, not processed yet")
        if protected:
            world.shop.app.signature(CHARGE, args=(order_id,)).apply_async(
                task_id=task_id, queue=SKEWED_QUEUE
            )
            say(f"the same execution delivered to a host whose clock is {SKEW_SECONDS} s ahead")
            world.wait(
                lambda: getattr(world.execution(task_id), "wake_requested", False), 30,
                "the skewed host to defer the duplicate",
            )  # fmt: skip
            say("it finds the lease live on the database's clock, and defers")
        else:
            world.shop.app.signature(PLAIN_REDRIVE_BY_AGE, args=([order_id], 60.0)).apply_async(
                queue=SKEWED_QUEUE
            )
            say(f"the stuck-order job runs on a host whose clock is {SKEW_SECONDS} s ahead")
            world.wait(
                lambda: _charge_requests(world, order_id) >= 2, 30, "the skewed host's charge"
            )
            say("to it the order is an hour old: it charges again")
    finally:
        hold.release()
    if protected:
        world.wait_state(task_id, "COMPLETED", timeout=40)
    world.wait(lambda: world.status(order_id) == "paid", 30, f"{order_id} to be paid")
    if not protected:
        world.wait(lambda: len(world.payments(order_id)) >= 2, 30, "both charges")
    return _paid_once(world, order_id, say, protected, "the duplicate deferred")


def _charge_requests(world: World, order_id: str) -> int:
    return (
        sum(1 for seen in world.gateway.charges_seen if seen.reference == order_id)
        if world.gateway
        else 0
    )
