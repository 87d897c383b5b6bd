"""Public calls given a wrong argument refuse it by name (TypeError or ValueError saying
what the argument takes) instead of failing inside with an AttributeError, or answering
as if all were well: a listing with a negative limit answered [], which an operator reads
as "no payment left behind"."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_agboss import AGBoss, answer_pause, errors, migrate, operator
from celery_agboss.core.executions import ExecutionState
from tests.delivery import conftest as delivery
from tests.delivery.conftest import PaymentShop

# The delivery tests' shop (a real worker's path on a migrated store), for the listing.
shop, shop_config, delivery_store_url = (
    delivery.shop,
    delivery.shop_config,
    delivery.delivery_store_url,
)

API = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")


@pytest.fixture
def app(tmp_path: Path) -> Celery:
    url = f"sqlite:///{tmp_path}/s.db"
    migrate(url)
    app = Celery("inputs", broker="memory://", set_as_current=False)
    app.conf.update(agboss_database_url=url, agboss_pseudonym_key="x" * 32)
    AGBoss(app).close()
    return app


@pytest.mark.parametrize("given", [None, "shop", object()])
def test_agboss_of_something_that_is_no_celery_app_is_a_type_error(given: Any) -> None:
    with pytest.raises(TypeError, match=r"AGBoss\(app\) takes the Celery app"):
        AGBoss(given)


def test_answer_pause_without_a_pause_id_is_a_type_error_naming_it(app: Celery) -> None:
    with pytest.raises(TypeError, match="pause_id must be the text '<execution id>:<name>'"):
        answer_pause(app, None, "yes")  # type: ignore[arg-type]


def test_answer_pause_with_an_answer_json_cannot_carry_names_the_answer(app: Celery) -> None:
    with pytest.raises(TypeError, match="answer must be a value JSON can carry"):
        answer_pause(app, "e:p", object())


@pytest.mark.parametrize(
    "limit, error", [(-1, ValueError), (0, ValueError), ("5", TypeError), (True, TypeError)]
)
@pytest.mark.parametrize(
    "listing",
    [operator.list_failed_after_payment, operator.list_executions, operator.list_pending],
    ids=["failed-after-payment", "executions", "pending"],
)
def test_a_limit_that_is_no_positive_int_is_refused(
    app: Celery, listing: Any, limit: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="limit must be a positive int"):
        listing(app, limit=limit)


@pytest.mark.parametrize("states", ["DONE", ["COMPLETED", 3], [None]])
def test_a_state_that_is_none_is_refused_listing_the_states(app: Celery, states: Any) -> None:
    with pytest.raises(ValueError, match=r"one of REQUESTED, RUNNING, .*COMPLETED"):
        operator.list_executions(app, states=states)


@pytest.mark.parametrize("delivery_store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "states",
    ["COMPLETED", ["COMPLETED"], ExecutionState.COMPLETED, [ExecutionState.COMPLETED]],
    ids=["name", "names", "state", "states"],
)
def test_states_by_name_or_by_state_list_the_execution(shop: PaymentShop, states: Any) -> None:
    charge = shop.call()

    @shop.task()
    def pay(self: Any) -> Any:
        return self.outbound(charge, {"amount": 1000}, business_key="order:inputs-1")

    task_id = shop.run(pay, states=("COMPLETED",))
    assert [r.id for r in operator.list_executions(shop.app, states=states)] == [task_id]
    assert operator.list_executions(shop.app, states="FAILED") == []


def test_the_api_page_writes_list_executions_as_the_code_takes_it() -> None:
    written = re.search(r"`list_executions\(app, \*, (\w+)=None", API)
    assert written is not None, "docs/api.md: list_executions(app, *, states=None, ...)"
    assert written.group(1) in inspect.signature(operator.list_executions).parameters


def test_every_error_the_api_page_names_is_in_its_errors_names_list() -> None:
    section = API.split("## `celery_agboss.errors`")[1].split("\n## ")[0]
    listed = set(re.findall(r"`(\w+)`", section.split("Names:")[1]))
    named = {name for name in re.findall(r"`(\w+Error)`", API) if hasattr(errors, name)}
    assert named <= listed, f"named but not in the errors Names: {sorted(named - listed)}"
