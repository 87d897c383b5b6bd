"""An operator settles a charge nobody can look up, as a user deploys the README.

README.md's ``shop.py`` from the installed wheel, its worker command, then the worker
SIGKILLed while the gateway holds its charge's answer, and the gateway's lookup down:
nothing can tell whether the customer paid, so a person decides with
``celery -A shop agboss resolve`` (docs/operators.md). The receipt mistyped as the
dashboard's status alone is refused (the README's ``OutboundCall`` declares
``transaction_id``), and nothing changes; the receipt as the gateway returned it is
taken, and the re-driven task marks the order paid with the one payment, no second
charge. Speed-ups, as the README's ``AGBOSS_<NAME>`` variables: the deployment suite's
5 s lease and 2 s sweep interval (``tests/deployment/deployment.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from celery_agboss.core.executions import execution_scope
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import SPEEDUPS, Deployment
from tests.deployment.test_recovery import HELD_SECONDS, kill_the_worker
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow]

ORDER = 7
TTL = float(SPEEDUPS["AGBOSS_LEASE_TTL"])
SETTLE_SECONDS = 60.0


def _resolve(deployment: Deployment, key: str, completed: object) -> tuple[int, str]:
    """``celery -A shop agboss resolve KEY --completed JSON --reason …``: exit code, output."""
    argv = [
        *deployment.commands.migrate[:-1],  # ``celery -A shop agboss``, as the README spells it
        "resolve",
        key,
        "--completed",
        json.dumps(completed),
        "--reason",
        "found in the gateway's dashboard",
    ]
    process = deployment.start(argv, "resolve")
    code = process.wait(60)
    return code, process.output()


def _a_charge_nobody_can_look_up(deployment: Deployment) -> dict[int, str]:
    """The README's worker charges the order; the gateway processes it and holds the
    answer; the worker is SIGKILLed (main process and pool), the gateway's lookup goes
    down, and the dead worker's lease expires: a PENDING intent only a person can settle."""
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    fake = deployment.gateway.gateway
    hold = fake.hold(operation="charge")
    ids = deployment.publish([ORDER])
    hold.wait_reached(timeout=HELD_SECONDS)
    fake.lookup_by_key = False  # the gateway's lookup is down: reconcile cannot tell
    kill_the_worker(worker)
    hold.release()
    scope = execution_scope(ids[ORDER])
    wait_until(
        lambda: not (lease := deployment.store.read_lease(scope)) or not lease.live,
        TTL + 10,
        message="the killed worker's lease to expire",
    )
    return ids


def test_a_mistyped_receipt_is_refused_and_the_real_one_pays_the_order_once(
    database_url: str, redis_url_factory: Callable[[], str], deploy: DeployFactory
) -> None:
    deployment = deploy(redis_url_factory(), database_url)
    deployment.prepare()
    ids = _a_charge_nobody_can_look_up(deployment)
    key = deployment.key_of(ORDER)
    [payment] = deployment.gateway.gateway.payments

    code, output = _resolve(deployment, key, {"status": "succeeded"})
    assert code == 1, output
    assert "finds no gateway id in this result" in output, output
    intent = deployment.store.read_intent(key)
    assert intent is not None and intent.status.value == "PENDING", intent

    code, output = _resolve(deployment, key, payment)
    assert code == 0, output
    deployment.start_beat()
    deployment.wait_ready(deployment.start_worker())
    deployment.wait_settled(ids, SETTLE_SECONDS)
    deployment.assert_each_paid_once(ids)
