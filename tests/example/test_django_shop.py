"""The example Django shop (``example_project/django_shop``), run as README.md's
"The example Django shop" section runs it, as real processes.

The section's three commands, read from its ``sh`` block: ``manage.py setupdemo``
(migrate, an admin user), ``manage.py rundemo`` (the fake Stripe, a Celery worker,
``runserver``), and the checkout's ``curl -X POST -d …`` (sent here with urllib: the same
form POST). Then the gateway saw one charge request and holds one payment, the ORM
table has the order paid once, and the admin lists it. The same shop then takes one
checkout form posted three times (a double click, two POSTs at once, and a proxy's retry):
its token makes them one order and one charge.

No speed-ups: the commands as written, with only what the test must own: its SQLite file
(``DJANGO_SHOP_DATABASE``), a Redis database of its own (``CELERY_BROKER_URL``), free ports
for ``runserver`` and the fake Stripe (``rundemo``'s ``addrport`` and
``--fake-stripe-port``), and this virtualenv's python for ``.venv/bin/python``. The test
process never imports Django.
"""

from __future__ import annotations

import json
import shlex
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ProcessFactory
from tests.deployment.readme import code_blocks, section
from tests.support.django_project import REPOSITORY, store_state
from tests.support.processes import ManagedProcess
from tests.support.throwaway import free_ports

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

SECTION = "The example Django shop"
SECONDS = 60.0
FAKE_STRIPE_KEY = "sk_test_agboss_fake_gateway"  # the settings' demo default
README_SITE = "http://127.0.0.1:8000"


def readme_commands() -> tuple[list[str], list[str], tuple[str, dict[str, str]]]:
    """The section's setup and run commands (argvs, this python for ``.venv/bin/python``),
    and its checkout: the URL ``curl`` posts to and its ``-d`` fields."""
    blocks = code_blocks(section(SECTION), "sh")
    assert len(blocks) == 1, f"README.md's '## {SECTION}' should have one ```sh block"
    commands = [shlex.split(line, comments=True) for line in blocks[0].splitlines()]
    setup, run, curl = [argv for argv in commands if argv]
    for argv in (setup, run):
        assert argv[0] == ".venv/bin/python", argv
        argv[0] = sys.executable
    options = curl[3:-1]
    assert curl[:3] == ["curl", "-X", "POST"] and options[::2] == ["-d"] * (len(options) // 2)
    assert options and len(options) % 2 == 0, curl
    form = dict(field.split("=", 1) for field in options[1::2])
    return setup, run, (curl[-1], form)


def _http(
    url: str, data: dict[str, str] | None = None, opener: Any = None, **headers: str
) -> tuple[int, str]:
    """A GET (or a form POST with ``data``, as ``curl -d`` sends it): status and body."""
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, headers={"Referer": url, **headers})
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=10) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return int(refused.code), refused.read().decode()
    except OSError:
        return 0, ""  # not listening yet


def _charge_requests(demo: ManagedProcess) -> list[str]:
    return [line for line in demo.output().splitlines() if "fake Stripe: charge request" in line]


def _admin_page(site: str, path: str) -> str:
    """``path`` of the admin, logged in as the demo's admin user."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
    login = f"{site}/admin/login/"
    status, page = _http(login, opener=opener)
    assert status == 200, page
    token = page.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    form = {"csrfmiddlewaretoken": token, "username": "admin", "password": "admin"}
    status, page = _http(f"{login}?next=/admin/", form, opener)
    assert status == 200 and "Log out" in page, page[-2000:]
    status, page = _http(f"{site}{path}", opener=opener)
    assert status == 200, page[-2000:]
    return page


@dataclass(frozen=True)
class RunningShop:
    """The shop as the section's commands leave it: ``setupdemo`` done, ``rundemo``
    running (the fake Stripe, a worker, ``runserver``)."""

    site: str
    stripe: str
    demo: ManagedProcess
    database_url: str

    def paid(self, order_id: int) -> dict[str, Any]:
        """The order's state once it is paid and its charge's execution completed."""

        def paid() -> dict[str, Any] | None:
            state = json.loads(_http(f"{self.site}/orders/{order_id}/")[1] or "{}")
            return state if state.get("status") == "paid" else None

        shown = self.demo.wait_until(paid, SECONDS, message=f"order {order_id} paid")
        task_id = shown["charge_task_id"]
        self.demo.wait_until(
            lambda: (
                store_state(
                    self.database_url,
                    "SELECT state FROM agboss_executions WHERE id = :id",
                    id=task_id,
                )
                == ("COMPLETED",)
            ),
            SECONDS,
            message=f"execution {task_id} completed",
        )
        return dict(shown)

    def payments(self) -> list[dict[str, Any]]:
        """Every PaymentIntent the fake Stripe holds."""
        status, listed = _http(
            f"{self.stripe}/v1/payment_intents", Authorization=f"Bearer {FAKE_STRIPE_KEY}"
        )
        assert status == 200, listed
        return list(json.loads(listed)["data"])

    def order_row(self, order_id: int) -> tuple[Any, ...]:
        return tuple(
            store_state(
                self.database_url,
                "SELECT status, payment_id, times_marked_paid FROM shop_order WHERE id = :id",
                id=order_id,
            )
        )


def _run_the_shop(
    tmp_path: Path, redis_url: str, managed_process: ProcessFactory
) -> tuple[RunningShop, tuple[str, dict[str, str]]]:
    """The section's ``setupdemo`` and ``rundemo``, on this test's own database, Redis
    database and ports; the shop, and the section's checkout (its URL and form)."""
    database = tmp_path / "db.sqlite3"
    env = {
        "DJANGO_SETTINGS_MODULE": "proj.settings",  # what manage.py sets, whatever this has
        "DJANGO_SHOP_DATABASE": str(database),
        "CELERY_BROKER_URL": redis_url,
    }
    setup_argv, run_argv, checkout = readme_commands()

    setup = managed_process(setup_argv, name="setupdemo", env=env, cwd=REPOSITORY)
    assert setup.wait(SECONDS) == 0, setup.describe()
    assert "Created the admin user 'admin'" in setup.output(), setup.describe()

    web_port, stripe_port = free_ports(2)
    site, stripe = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{stripe_port}"
    ports = [f"127.0.0.1:{web_port}", "--fake-stripe-port", str(stripe_port)]
    demo = managed_process([*run_argv, *ports], name="rundemo", env=env, cwd=REPOSITORY)
    demo.wait_until(lambda: " ready." in demo.output(), SECONDS, message="the worker ready")
    demo.wait_until(lambda: _http(f"{site}/admin/login/")[0] == 200, SECONDS, message="runserver")
    return RunningShop(site, stripe, demo, f"sqlite:///{database}"), checkout


def test_the_readme_commands_charge_once_and_mark_the_order_paid_once(
    tmp_path: Path, redis_url: str, managed_process: ProcessFactory
) -> None:
    shop, (checkout_url, checkout_form) = _run_the_shop(tmp_path, redis_url, managed_process)
    site, demo = shop.site, shop.demo

    assert checkout_url.startswith(README_SITE), checkout_url
    status, body = _http(site + checkout_url.removeprefix(README_SITE), checkout_form)
    assert status == 202, body
    placed = json.loads(body)
    order_id, task_id = placed["order"], placed["charge_task_id"]
    assert placed["status"] == "pending" and task_id, placed
    shown = shop.paid(order_id)

    # The gateway: one charge request arrived, and it holds one payment, for this order.
    assert len(_charge_requests(demo)) == 1, demo.describe()
    payments = shop.payments()
    assert [p["metadata"]["reference"] for p in payments] == [f"order-{order_id}"], payments
    assert (
        payments[0]["amount"] == int(checkout_form["amount"])
        and payments[0]["status"] == "succeeded"
    ), payments

    # The ORM table: paid once, with the gateway's payment.
    row = shop.order_row(order_id)
    assert row == ("paid", payments[0]["id"], 1), row
    assert shown["payment_id"] == payments[0]["id"], shown

    # The admin lists it, and the payment's execution with its verified history.
    page = _admin_page(site, "/admin/shop/order/")
    assert payments[0]["id"] in page, page[-2000:]
    executions = _admin_page(site, "/admin/agboss/execution/")
    assert task_id in executions, executions[-2000:]
    execution = _admin_page(site, f"/admin/agboss/execution/{task_id}/change/")
    assert "chain verified" in execution and "CHAIN BROKEN" not in execution, execution[-2000:]


def test_the_same_checkout_posted_twice_is_one_order_and_one_charge(
    tmp_path: Path, redis_url: str, managed_process: ProcessFactory
) -> None:
    """A double click (two POSTs of one form at once) and a proxy's retry after it: the
    form's token finds the order the first POST placed; one charge is published, once."""
    shop, (checkout_url, _) = _run_the_shop(tmp_path, redis_url, managed_process)
    url = shop.site + checkout_url.removeprefix(README_SITE)
    status, page = _http(url)  # the form, with its token
    assert status == 200, page
    token = page.split('name="checkout_token" value="', 1)[1].split('"', 1)[0]
    form = {"amount": "1500", "checkout_token": token}

    answers: list[tuple[int, str]] = []
    clicks = [threading.Thread(target=lambda: answers.append(_http(url, form))) for _ in (1, 2)]
    for click in clicks:
        click.start()
    for click in clicks:
        click.join(SECONDS)
    answers.append(_http(url, form))  # the proxy's retry, once the first answered
    assert sorted(status for status, _ in answers) == [200, 200, 202], answers
    placed = [json.loads(body) for _, body in answers]
    order_id = placed[0]["order"]
    assert {(p["order"], p["charge_task_id"]) for p in placed} == {
        (order_id, placed[0]["charge_task_id"])
    }, placed
    shown = shop.paid(order_id)

    # The same token with another amount places nothing; no token is refused.
    status, body = _http(url, {**form, "amount": "1600"})
    assert status == 409 and json.loads(body)["order"] == order_id, body
    status, body = _http(url, {"amount": "1500"})
    assert status == 400 and "checkout_token" in body, body

    # One order, one charge request at the fake Stripe, one payment, marked paid once.
    assert _http(f"{shop.site}/orders/{order_id + 1}/")[0] == 404
    assert len(_charge_requests(shop.demo)) == 1, shop.demo.describe()
    payments = shop.payments()
    assert [p["metadata"]["reference"] for p in payments] == [f"order-{order_id}"], payments
    assert shop.order_row(order_id) == ("paid", payments[0]["id"], 1)
    assert shown["payment_id"] == payments[0]["id"], shown
