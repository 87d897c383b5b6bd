"""The idempotency key expires before a retry (design: PS17), the tests named s15: a pool
child is SIGKILLed with its charge's answer in flight, on a gateway that cannot be looked
up, and the key has expired at the gateway before the take-over.

The shop differs from README.md's in one place, its ``reconcile``: this gateway has no
lookup (design: G2), so the only way to learn what became of a charge is to send it again under
its key, which the gateway answers from the first charge while it keeps the key (design: G1).
``reconcile`` therefore answers ``NotSent()`` — "resend under the same key" — and the
call declares the gateway's documented retention, as PS17 asks of a replay-only
gateway. Past ``key_retention - attempt_timeout`` of key age (on the database's clock)
the product must send nothing: ``OutboundCallUnreconciledError``, the intent flagged
``key-too-old`` and the execution ``WAITING_OPERATOR``, listed by
``celery -A shop agboss pending``. The gateway keeps keys 4 s on its own clock, and the
take-over comes at the earliest a lease TTL (5 s) after the charge: the key is gone by
then, so a resend is a second payment — what the sabotage run (``NO_KEY_AGE_CHECK``,
PostgreSQL+Redis) shows.

- s15 key expired, not resent: SQLite+Redis, PostgreSQL+Redis.

Speed-ups, all README ``AGBOSS_<NAME>`` variables: tests/faults/scenario.py's
(TTL 5 s, sweep every 2 s, grace 3 s, retry after 1 s) and ``AGBOSS_ATTEMPT_TIMEOUT=2``
(120 s), with the gateway's retention shrunk from days to 4 s: a resend is allowed only
within 2 s of the first attempt, and the take-over comes later. (The database's clock
decides the key's age, so skewing a worker's clock could not age the key: see
hooks/agboss_clock_hook.py.)
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from celery_agboss.core.protections import NO_KEY_AGE_CHECK
from celery_agboss.core.store_protocol import IntentRecord
from celery_agboss.store.intents import read_txn
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.deployment.test_recovery import HELD_SECONDS, recovery_deadline
from tests.faults.scenario import (
    FAULT_SPEEDUPS,
    POSTGRES_REDIS,
    SQLITE_REDIS,
    Stack,
    charges_of,
    kill_the_child,
    sabotaged,
    wait_for_a_second_payment,
    worker_and_beat,
)
from tests.support.processes import ManagedProcess, wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow]


ORDER = 15
GATEWAY_KEY_RETENTION_SECONDS = 4.0
KEY_SPEEDUPS = {**FAULT_SPEEDUPS, "AGBOSS_ATTEMPT_TIMEOUT": "2"}

NO_LOOKUP_SHOP = """\
import os
from datetime import timedelta

from celery import Celery

from celery_agboss import AGBoss, NotSent, OutboundCall, PaymentTask
from payments import gateway, mark_paid

app = Celery("shop", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.agboss_database_url = os.environ["AGBOSS_DATABASE_URL"]
app.conf.agboss_pseudonym_key = os.environ["AGBOSS_PSEUDONYM_KEY"]
AGBoss(app)


def send_charge(call):
    return gateway.charge(call.request["amount"], idempotency_key=call.idempotency_key)


def reconcile_charge(call, lookup):  # no lookup at this gateway: resend under the key
    return NotSent()


charge = OutboundCall(name="gateway.charge", send=send_charge, reconcile=reconcile_charge,
                      key_retention=timedelta(seconds=RETENTION))  # the gateway's


@app.task(base=PaymentTask, bind=True)
def charge_order(self, order_id):
    receipt = self.outbound(charge, {"amount": 1000, "order": order_id},
                            business_key=f"order:{order_id}")
    self.fenced_effect("mark-paid", lambda conn: mark_paid(conn, order_id, receipt),
                       business_key=f"order:{order_id}")
    return receipt
""".replace("RETENTION", repr(GATEWAY_KEY_RETENTION_SECONDS))


def _deployed_without_lookup(
    deploy: DeployFactory, stack: Stack, extra: dict[str, str] | None = None
) -> Deployment:
    """The shop above, on a gateway that keeps keys 4 s and cannot be looked up."""
    deployment = deploy(*stack, speedups={**KEY_SPEEDUPS, **(extra or {})})
    (deployment.app_dir / "shop.py").write_text(NO_LOOKUP_SHOP, encoding="utf-8")
    fake = deployment.gateway.gateway
    fake.capabilities = replace(
        fake.capabilities,
        idempotency_keys=True,
        first_response_on_repeat=True,
        key_retention=GATEWAY_KEY_RETENTION_SECONDS,
        lookup_by_key=False,
        reference_lookup=False,
    )
    return deployment


def _kill_the_child_with_the_answer_in_flight(
    deployment: Deployment, worker: ManagedProcess
) -> str:
    """The gateway charges and holds its answer; the pool child that sent it is SIGKILLed
    (the worker's main process lives on). Returns the task id."""
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge")
    task_id = deployment.publish([ORDER])[ORDER]
    hold.wait_reached(timeout=HELD_SECONDS)
    child = deployment.gateway.pid_of_charge(deployment.key_of(ORDER))
    kill_the_child(worker, child)
    hold.release()
    return task_id


def _intent(deployment: Deployment) -> IntentRecord | None:
    with deployment.store.engine.connect() as conn:
        return read_txn(conn, deployment.key_of(ORDER))


def _pending_listing(deployment: Deployment) -> dict[str, Any]:
    """What ``celery -A shop agboss pending --json`` tells an operator."""
    output = deployment.run(["celery", "-A", "shop", "agboss", "pending", "--json"], "pending")
    found: dict[str, Any] = json.JSONDecoder().raw_decode(output[output.index("{") :])[0]
    return found


@pytest.mark.parametrize("stack", [SQLITE_REDIS, POSTGRES_REDIS], indirect=True)
def test_s15_a_key_expired_before_the_take_over_is_not_resent_and_waits_for_an_operator(
    stack: Stack, deploy: DeployFactory
) -> None:
    """The take-over's reconcile answers "resend", but the key is older than
    ``key_retention - attempt_timeout``: nothing is sent, the intent stays PENDING
    flagged ``key-too-old``, the execution waits for an operator and says so in
    ``agboss pending``. One payment (the killed child's), never two."""
    deployment = _deployed_without_lookup(deploy, stack)
    worker = worker_and_beat(deployment)
    task_id = _kill_the_child_with_the_answer_in_flight(deployment, worker)
    wait_until(
        lambda: deployment.states([task_id])[task_id] == "WAITING_OPERATOR",
        recovery_deadline(),
        message=lambda: f"an operator's wait\n{deployment.progress({ORDER: task_id})}",
    )
    assert charges_of(deployment, ORDER) == (1, 1), "the expired key was sent again"
    assert deployment.gateway.gateway.lookups == [], "this gateway cannot be looked up"
    assert deployment.paid_rows() == {}
    intent = _intent(deployment)
    assert intent is not None and intent.status.value == "PENDING", intent
    assert intent.needs_operator and intent.operator_reason == "key-too-old", intent
    listing = _pending_listing(deployment)
    keys = {i["idempotency_key"]: i for i in listing["pending"]}
    assert keys[deployment.key_of(ORDER)]["operator_reason"] == "key-too-old", listing
    assert task_id in {e["id"] for e in listing["waiting_executions"]}, listing


def test_s15_sabotaged_without_the_key_age_check_an_expired_key_pays_twice(
    sabotage_stack: Stack, deploy: DeployFactory
) -> None:
    """The same take-over resends the ``NotSent()`` whatever the key's age: the gateway
    no longer knows the key and charges the order a second time."""
    deployment = _deployed_without_lookup(deploy, sabotage_stack, sabotaged(NO_KEY_AGE_CHECK))
    worker = worker_and_beat(deployment)
    task_id = _kill_the_child_with_the_answer_in_flight(deployment, worker)
    wait_for_a_second_payment(deployment, ORDER, {ORDER: task_id})
