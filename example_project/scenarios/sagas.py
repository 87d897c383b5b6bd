"""A saga's undo and a person's approval: PS10 and PS11, on the real workers.

PS10 kills the pool process that is refunding a failed order, with the refund made at the
gateway and its answer held there; PS11 has two approvers answer one pause from two
processes at the same moment (``celery -A example_project.shop agboss answer-pause``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

from example_project import orders
from example_project.scenarios.catalog import Outcome, Say, charges, plural, scenario
from example_project.scenarios.world import REPO_ROOT, World

PLACE = "example_project.shop.place_order"
PLAIN_PLACE = "plain.place_order"
APPROVE = "example_project.shop.approve_large_order"
PLAIN_APPROVE = "plain.approve_large_order"
CLI_SECONDS = 60.0


def refunds_of(world: World, order_id: str) -> list[dict[str, Any]]:
    """The refunds the gateway made of the order's payments, whoever asked for them."""
    paid = {payment["id"] for payment in world.payments(order_id)}
    return [refund for refund in world.fake.refunds if refund["payment"] in paid]


@contextlib.contextmanager
def refund_senders(world: World) -> Iterator[list[int | None]]:
    """The pids of the processes that POST a refund, in order, while inside.

    ``hold_next_answer`` says who sent a held charge, not a refund; so the runner's
    server records each refund's sender itself (the same ``sender_pid()`` the hold uses,
    read from the connection's other end), and delegates to the server as before.
    """
    server = world.gateway
    assert server is not None
    original = server.handle
    seen: list[int | None] = []

    def handle(call: Any) -> Any:
        if call.method == "POST" and call.path == "/v1/refunds":
            seen.append(call.sender_pid())
        return original(call)

    server.handle = handle  # type: ignore[method-assign]  # the HTTP handler calls owner.handle
    try:
        yield seen
    finally:
        delattr(server, "handle")


def _sku(world: World, label: str) -> str:
    """A product of the scenario's own, out of stock: no other scenario's order reserves it."""
    sku = f"{label}-{world.run_id}-{uuid.uuid4().hex[:4]}"
    with world.shop.agboss.store.engine.begin() as conn:
        orders.stock_up(conn, sku, 0)
    return sku


@scenario("ps10", "A saga: a charge and its refund, replayed or interrupted")
def ps10(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps10", sku=_sku(world, "ps10"))
    held = world.fake.hold(operation="refund", timeout=20)
    try:
        with refund_senders(world) as senders:
            task_id = world.publish(PLACE if protected else PLAIN_PLACE, order_id)
            world.wait(lambda: held.reached, 30, "the refund to reach the gateway")
            pid = senders[0]
            assert pid is not None, "the refund's sender could not be told"
            say(
                "charged; out of stock; the refund was made and its answer is held; "
                f"the refunding pool process {pid}: SIGKILL"
            )
            world.kill(pid)
            held.release()
            if protected:
                world.wait_state(task_id, "FAILED", timeout=40)
            else:
                # Observed, not required: the plain twin's harm is reported as it came.
                world.observe(lambda: len(refunds_of(world, order_id)) >= 2, 40)
    finally:
        held.release()  # a hold never reached passes every later refund through
    payments, refunds = len(world.payments(order_id)), len(refunds_of(world, order_id))
    marked = world.count(order_id, "refunded")
    say(
        f"the gateway made {charges(payments)} and {plural(refunds, 'refund')}; "
        f"the order was marked refunded {marked}x"
    )
    if protected:
        ok = payments == 1 and refunds == 1 and marked == 1
        state = world.state(task_id)
        return Outcome(f"1 charge, {plural(refunds, 'refund')} after the crash, {state}", ok)
    return Outcome(f"{charges(payments)}, {plural(refunds, 'refund')}", refunds > 1)


def _cli(world: World, *argv: str) -> subprocess.Popen[bytes]:
    """``python -m celery -A example_project.shop …`` as an operator runs it, in the
    world's environment (its store, broker and gateway)."""
    env = {**os.environ, **world.environment(), "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "celery", "-A", "example_project.shop", *argv]
    return subprocess.Popen(
        command,
        env=env,
        cwd=str(world.root),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _finish(processes: list[subprocess.Popen[bytes]]) -> list[tuple[int, str]]:
    """Each process's exit status and output; any still running at the deadline is killed."""
    done = []
    try:
        for process in processes:
            output, _ = process.communicate(timeout=CLI_SECONDS)
            done.append((process.returncode, output.decode(errors="replace").strip()))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    return done


@scenario("ps11", "A pause answered twice")
def ps11(world: World, protected: bool, say: Say) -> Outcome:
    order_id = world.order("ps11", amount=250_000)
    approvers = ("alice", "bob")
    if protected:
        task_id = world.publish(APPROVE, order_id)
        world.wait_state(task_id, "PAUSED", timeout=30)
        pause_id = f"{task_id}:approve"
        say(f"the large order waits for approval ({pause_id}); two approvers answer at once")
        answers = [json.dumps({"approved": True, "by": name}) for name in approvers]
        runs = [
            _cli(world, "agboss", "answer-pause", pause_id, answer, "--json") for answer in answers
        ]
    else:
        say("two approvers press approve at once (each a `celery call` of the approval)")
        runs = [
            _cli(world, "call", PLAIN_APPROVE, "--args", json.dumps([order_id, name]))
            for name in approvers
        ]
    results = _finish(runs)
    if protected:
        won = [name for name, (code, _) in zip(approvers, results, strict=True) if code == 0]
        refused = [out for code, out in results if code != 0 and "not-paused" in out]
        say(f"answered by {', '.join(won) or 'nobody'}; {len(refused)} refused (NotPausedError)")
        world.wait_state(task_id, "COMPLETED", timeout=30)
    else:
        failed = [out for code, out in results if code != 0]
        if failed:
            raise RuntimeError(f"celery call failed: {failed[0][-500:]}")
        world.wait(lambda: len(world.payments(order_id)) >= 2, 30, "a charge per approval")
        world.wait(lambda: world.count(order_id, "paid") >= 2, 30, "both charges marked paid")
    payments, paid = len(world.payments(order_id)), world.count(order_id, "paid")
    say(f"the gateway made {charges(payments)}; the order was marked paid {paid}x")
    if protected:
        ok = payments == 1 and paid == 1 and len(won) == 1 and len(refused) == 1
        return Outcome(f"{charges(payments)}, one answer won, the other NotPausedError", ok)
    return Outcome(f"{charges(payments)}, one per approval", payments > 1)
