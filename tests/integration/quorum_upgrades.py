"""A charge a newer version moved on, delivered to a worker of this version on a quorum
queue: the set-up the rolling-upgrade tests on RabbitMQ share."""

from __future__ import annotations

from typing import Any

from tests.integration.apps import quorum_app
from tests.integration.harness import Shop, ShopFactory
from tests.support.newer_states import FUTURE_STATE, write_raw_state
from tests.support.processes import ManagedProcess

HANDED_BACK = "error=StateOfANewerVersion"
"""The worker's log line for a message handed back to the broker."""


def charges(shop: Shop) -> int:
    return len(shop.gateway.gateway.requests)


def set_state(shop: Shop, execution_id: str, state: str) -> None:
    """The row's state as a newer version's worker (or the upgrade's end) writes it."""
    write_raw_state(shop.agboss.store.engine, execution_id, state)


def a_newer_versions_charge(
    shop_factory: ShopFactory,
    rabbitmq_url: str,
    *,
    order: str,
    delivery_limit: int,
    sabotage: tuple[str, ...] = (),
    apply_options: dict[str, Any] | None = None,
    **config: object,
) -> tuple[Shop, str, ManagedProcess]:
    """``order``'s charge recorded, its row moved to a state this version does not know,
    then a worker of this version started on a quorum queue of ``delivery_limit``."""
    shop = shop_factory(
        broker_url=rabbitmq_url, app_module=quorum_app, delivery_limit=delivery_limit, **config
    )
    task = shop.app.tasks["it.charge_order"]
    execution_id = str(task.apply_async((order,), **(apply_options or {})).id)
    set_state(shop, execution_id, FUTURE_STATE)
    return shop, execution_id, shop.start_worker(concurrency=1, sabotage=sabotage)
