"""A Django project's worker pays from the store in its own ``DATABASES``.

Issue 27, as a Django shop deploys it: ``manage.py migrate`` makes the
tables, ``celery -A proj worker`` runs with the app Celery's Django guide writes (its
settings read with ``namespace="CELERY"``, no ``agboss_database_url``), and a process
of the project publishes the charge. The order is charged once, counted at the
gateway, and its execution completes in the project's database, on SQLite and on
PostgreSQL. Deployment speed-ups (tests/support/django_shop): ``-Q`` the test's queue,
a 5 s lease, a 1 s retry delay, a 1 s sweep loop
(``agboss sweep --loop``, a deployment without beat).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ProcessFactory
from tests.support.django_shop.harness import DjangoShop, shop_on

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(params=["sqlite", "postgresql"])
def shop(
    request: pytest.FixtureRequest,
    redis_url: str,
    managed_process: ProcessFactory,
    tmp_path: Path,
) -> Iterator[DjangoShop]:
    with shop_on(request.param, request, redis_url, managed_process, tmp_path) as made:
        yield made


def test_the_worker_of_a_django_project_charges_once_from_its_database(shop: DjangoShop) -> None:
    shop.start()
    task_id = shop.publish("charge_order", "7", 1500)
    shop.wait_state(task_id, "COMPLETED")
    assert [c.reference for c in shop.gateway.charges_seen] == ["7"]
