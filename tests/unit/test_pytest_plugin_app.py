"""The ``agboss`` pytest plugin as a user meets it: a payment task on a real worker.

The first tests are written the way a user of the package writes them: nothing but
the plugin's fixtures (``agboss_app``, ``agboss_worker``, ``fake_gateway``), a
``PaymentTask`` that charges through an ``OutboundCall`` and marks the order paid in
a fenced effect, and assertions on ``fake_gateway.payments``. The last ones check
the fixtures themselves: what they configure and what their teardown leaves.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.engine import Connection

from celery_agboss import AGBoss, Completed, NotSent, OutboundCall, PaymentTask
from celery_agboss.core.outbound import CallContext, Lookup
from celery_agboss.testing import FakeGateway, FakeGatewayFault, VirtualClock, is_definite_failure

pytest_plugins = ["pytester"]

# --- what a user writes ----------------------------------------------------------------

shop_tables = MetaData()
paid_orders = Table(
    "shop_paid_orders",
    shop_tables,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", Integer, nullable=False),
    Column("payment_id", String(64), nullable=False),
)


@pytest.fixture
def charge_order(agboss_app: Celery, fake_gateway: FakeGateway) -> Any:
    """The shop's payment task, on the test app, charging the fake gateway."""
    shop_tables.create_all(AGBoss.of(agboss_app).store.engine)

    def send_charge(call: CallContext) -> Any:
        return fake_gateway.charge(call.request["amount"], call.idempotency_key)

    def reconcile_charge(call: CallContext, lookup: Lookup) -> Completed[Any] | NotSent:
        found = fake_gateway.lookup(lookup.idempotency_key)
        return NotSent() if found is None else Completed(found)

    charge = OutboundCall(
        name="shop.charge",
        send=send_charge,
        reconcile=reconcile_charge,
        is_definite_failure=is_definite_failure,
        key_retention=timedelta(hours=24),
    )

    def mark_paid(conn: Connection, order_id: int, receipt: Any) -> int:
        conn.execute(insert(paid_orders).values(order_id=order_id, payment_id=receipt["id"]))
        return order_id

    @agboss_app.task(base=PaymentTask, bind=True, name="shop.charge_order")  # type: ignore[untyped-decorator]
    def charge_order(self: PaymentTask, order_id: int) -> dict[str, Any]:
        receipt = self.outbound(
            charge, {"amount": 1000, "order": order_id}, business_key=f"order:{order_id}"
        )
        outcome = self.last_outcome
        self.fenced_effect(
            "mark-paid",
            lambda conn: mark_paid(conn, order_id, receipt),
            business_key=f"order:{order_id}",
        )
        return {"payment": receipt["id"], "outcome": outcome.value if outcome else None}

    return charge_order


def times_marked_paid(app: Celery, order_id: int) -> int:
    with AGBoss.of(app).store.engine.connect() as conn:
        count = conn.execute(
            select(func.count()).select_from(paid_orders).where(paid_orders.c.order_id == order_id)
        ).scalar_one()
    return int(count)


def test_an_order_is_charged_once_and_marked_paid_by_a_real_worker(
    agboss_app: Celery, charge_order: Any, agboss_worker: Any, fake_gateway: FakeGateway
) -> None:
    result = charge_order.delay(42).get(timeout=10)

    assert result["outcome"] == "SENT"
    assert [p["id"] for p in fake_gateway.payments] == [result["payment"]]
    assert times_marked_paid(agboss_app, 42) == 1


def test_a_second_delivery_of_the_same_task_id_replays_instead_of_charging_again(
    agboss_app: Celery, charge_order: Any, agboss_worker: Any, fake_gateway: FakeGateway
) -> None:
    task_id = str(uuid.uuid4())
    first = charge_order.apply_async((42,), task_id=task_id).get(timeout=10)
    second = charge_order.apply_async((42,), task_id=task_id).get(timeout=10)

    assert second == first
    assert len(fake_gateway.payments) == 1
    assert len(fake_gateway.requests) == 1  # the replay did not even ask the gateway
    assert times_marked_paid(agboss_app, 42) == 1


def test_a_lost_answer_is_reconciled_by_the_retry_and_the_order_is_charged_once(
    agboss_app: Celery, charge_order: Any, agboss_worker: Any, fake_gateway: FakeGateway
) -> None:
    fake_gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)

    result = charge_order.delay(42).get(timeout=10)

    assert result["outcome"] == "RECONCILED"  # looked up, not sent again
    assert len(fake_gateway.payments) == 1
    assert [p["id"] for p in fake_gateway.payments] == [result["payment"]]
    assert times_marked_paid(agboss_app, 42) == 1


def test_a_task_declared_after_the_worker_started_still_runs(
    agboss_app: Celery, agboss_worker: Any
) -> None:
    @agboss_app.task(name="shop.ping")  # type: ignore[untyped-decorator]
    def ping() -> str:
        return "pong"

    assert ping.delay().get(timeout=10) == "pong"


# --- what the fixtures set up ----------------------------------------------------------


def test_the_app_uses_the_throwaway_store_on_the_test_clock(
    agboss_app: Celery, agboss_store: Any, agboss_clock: VirtualClock
) -> None:
    boss = AGBoss.of(agboss_app)
    assert boss.settings.database_url == str(agboss_store.engine.url)
    assert boss.settings.lease_ttl_seconds == 5
    assert boss.settings.sweep_interval_seconds == 0
    assert "celery_agboss.sweep" not in (agboss_app.conf.beat_schedule or {})

    agboss_clock.advance(3600)
    assert boss.store.offset_ms() == agboss_clock.offset_ms() >= 3_600_000


class TestApplyWithoutAWorker:
    """An eager run's fenced transactions run in the test thread of the suite's one big
    process. On SQLite the watchdog rolls back one that holds the write lock for a
    quarter of the lease TTL (design: lock bound): with the plugin's 5 s, a pause of 1.25 s
    anywhere in that process (seen late in full-suite runs) ends this run RUNNING. A
    20 s lease keeps the test about ``apply``, not about the machine's pauses."""

    @pytest.fixture
    def agboss_app_config(self) -> dict[str, Any]:
        return {"agboss_lease_ttl": 20}

    def test_without_a_worker_apply_runs_one_delivery_in_the_test_thread(
        self, agboss_app: Celery, charge_order: Any, fake_gateway: FakeGateway
    ) -> None:
        result = charge_order.apply((42,)).get()

        assert result["outcome"] == "SENT"
        assert len(fake_gateway.payments) == 1
        assert times_marked_paid(agboss_app, 42) == 1


class TestOverridingTheAppConfig:
    @pytest.fixture
    def agboss_app_config(self) -> dict[str, Any]:
        return {"agboss_tenant": "shop-tests", "agboss_lease_ttl": 7}

    def test_agboss_app_config_changes_the_app_settings(self, agboss_app: Celery) -> None:
        settings = AGBoss.of(agboss_app).settings
        assert (settings.tenant, settings.lease_ttl_seconds) == ("shop-tests", 7)


def test_the_fixtures_leave_no_thread_and_no_default_app_behind(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_user="""
        from celery_agboss import PaymentTask

        def test_a_worker_runs_a_payment_task(agboss_app, agboss_worker, fake_gateway):
            @agboss_app.task(base=PaymentTask, bind=True)
            def charge(self, order_id):
                return order_id

            assert charge.delay(7).get(timeout=10) == 7
        """
    )
    from celery import _state as celery_state

    default_before = celery_state.default_app
    threads_before = set(threading.enumerate())

    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--assert=plain", "-W", "error")

    result.assert_outcomes(passed=1)
    assert celery_state.default_app is default_before
    left = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert left == []
