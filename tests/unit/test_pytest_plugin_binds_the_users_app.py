"""The ``agboss`` pytest plugin runs the user's own app: the README's ``shop.py`` as written.

A user project in a temporary directory: README.md's ``shop.py`` unchanged, a
``payments.py`` whose gateway client would call the real gateway, and the
``conftest.py`` and test docs/testing.md shows (``agboss_bind`` over ``agboss_app``,
the gateway name patched with ``fake_gateway``, the user's own table created on the
test store). Run by pytest in a subprocess (the user's conftest sets environment
variables). Then ``bound_app`` itself: the user's configuration is back afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery

from celery_agboss import AGBoss
from celery_agboss.store.migrate import migrate
from celery_agboss.testing.celery_app import bound_app
from celery_agboss.testing.stores import sqlite_store_url
from tests.deployment import readme

pytest_plugins = ["pytester"]

PAYMENTS = '''
"""The user's gateway client (never reached in these tests) and their own write."""
from sqlalchemy import text


class GatewayClient:
    def charge(self, amount, idempotency_key):
        raise RuntimeError("a test reached the real gateway")

    def lookup(self, idempotency_key):
        raise RuntimeError("a test reached the real gateway")


gateway = GatewayClient()


def mark_paid(conn, order_id, receipt):
    conn.execute(
        text("INSERT INTO shop_paid_orders (order_id, payment) VALUES (:o, :p)"),
        {"o": str(order_id), "p": receipt["id"]},
    )
    return order_id
'''

CONFTEST = """
import os

# shop.py reads these when it is imported; the tests bind it to their own store.
os.environ.setdefault("AGBOSS_DATABASE_URL", "sqlite:////nonexistent/not-used-by-the-tests.db")
os.environ.setdefault("AGBOSS_PSEUDONYM_KEY", "only-to-import-shop-in-the-tests")

import pytest
from sqlalchemy import MetaData, Table, Column, String

import shop

tables = MetaData()
Table(
    "shop_paid_orders",
    tables,
    Column("order_id", String(64), primary_key=True),
    Column("payment", String(64)),
)


@pytest.fixture
def agboss_app(agboss_bind, agboss_database_url):
    app = agboss_bind(shop.app)
    from sqlalchemy import create_engine

    engine = create_engine(agboss_database_url)  # your tables, beside celery_agboss's
    tables.create_all(engine)
    engine.dispose()
    return app


@pytest.fixture(autouse=True)
def fake_payments(monkeypatch, fake_gateway):
    monkeypatch.setattr(shop, "gateway", fake_gateway)  # the name shop.py calls
"""

TEST_SHOP = """
from sqlalchemy import text

from celery_agboss import AGBoss
from celery_agboss.testing import FakeGatewayFault

import shop


def paid_rows(app):
    with AGBoss.of(app).store.engine.connect() as conn:
        return conn.execute(text("SELECT order_id, payment FROM shop_paid_orders")).all()


def test_a_lost_answer_charges_once(agboss_app, agboss_worker, fake_gateway):
    fake_gateway.inject_fault(FakeGatewayFault.ANSWER_THEN_DROP)
    receipt = shop.charge_order.delay(42).get(timeout=30)  # the retry reconciles
    assert [p["id"] for p in fake_gateway.payments] == [receipt["id"]]
    assert paid_rows(agboss_app) == [("42", receipt["id"])]


def test_one_delivery_in_the_tests_thread(agboss_app, fake_gateway):
    receipt = shop.charge_order.apply((7,)).get()
    assert len(fake_gateway.payments) == 1 and receipt["id"] == fake_gateway.payments[0]["id"]
    assert agboss_app is shop.app
"""


def test_the_readme_shop_runs_as_written_on_the_test_store_and_the_fake_gateway(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        shop=readme.shop_source(), payments=PAYMENTS, conftest=CONFTEST, test_shop=TEST_SHOP
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=2)


def test_a_bound_app_gets_its_own_configuration_back(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    own_url = sqlite_store_url(own)
    app = Celery("users-own", broker="redis://127.0.0.1:6379/15", set_as_current=False)
    app.conf.agboss_database_url = own_url
    app.conf.agboss_pseudonym_key = "the-users-own-pseudonym-key"
    boss = AGBoss(app)
    assert boss.settings.database_url == own_url
    test = tmp_path / "test"
    test.mkdir()
    test_url = sqlite_store_url(test)
    migrate(test_url)
    with bound_app(app, test_url, config={"agboss_retry_delay": 0.5}):
        assert boss.settings.database_url == test_url
        assert boss.settings.retry_delay_seconds == 0.5
        assert app.conf.broker_url == "memory://"
        assert boss.store.now_ms() > 0
    assert boss.settings.database_url == own_url
    assert boss.settings.pseudonym_key == b"the-users-own-pseudonym-key"
    assert boss.settings.retry_delay_seconds == 5
    assert app.conf.broker_url == "redis://127.0.0.1:6379/15"
    app.close()
