"""A copy of a store keeps its deployment id, so its keys are the original's
(docs/keys.md, "A copy of a store").

What it proves, on SQLite (a copied file) and PostgreSQL (``CREATE DATABASE … TEMPLATE``):
``migrate`` records where the id was minted and a copy is told it is one (the original
is not); a worker's first read of the id logs a WARNING on a copy and still starts;
``new_deployment_id`` gives the copy keys of its own, so on one gateway account both
customers are charged (without it the copy's order is paid with the original's
payment: one payment at the gateway); it is refused while an execution is not terminal
or an intent is pending, changing nothing; ``same_deployment`` records a restore's new
place and keeps the id.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from celery_agboss.errors import OperatorRefusedError
from celery_agboss.store.deployment import (
    PLACE_META_KEY,
    PlaceCheck,
    check_place,
    new_deployment_id,
    read_store_tenant,
    same_deployment,
)
from celery_agboss.store.migrate import migrate
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from celery_agboss.testing.celery_app import close_test_app, make_test_app
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGateway
from tests.contract.conftest import BACKENDS, copy_of_a_database, empty_database
from tests.delivery.conftest import PaymentShop


def copy_of_a_store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """A migrated store (``request.param``'s backend) and a copy of it."""
    original = empty_database(request, tmp_path / "original")
    migrate(original)
    return original, copy_of_a_database(original, request, tmp_path / "copy")


@pytest.fixture(params=BACKENDS)
def original_and_copy(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    return copy_of_a_store(request, tmp_path)


def place_of(store: SQLAlchemyStore) -> PlaceCheck:
    with store.read_transaction() as tx:
        return check_place(tx.connection)


def _pay_order(shop: PaymentShop) -> Any:
    charge = shop.call()

    @shop.task()
    def pay_order(self: Any, order: str, amount: int) -> Any:
        return self.outbound(charge, {"amount": amount, "order": order}, business_key=order)

    return pay_order


def _both_pay_order_1001(original_url: str, copy_url: str) -> FakeGateway:
    """The original and the copy each charge their order 1001 on ONE gateway account."""
    clock = VirtualClock()
    gateway = FakeGateway(clock=clock, hold_timeout=20)
    apps = [
        make_test_app(url, clock_offset_source=clock.offset_ms) for url in (original_url, copy_url)
    ]
    try:
        for app in apps:
            shop = PaymentShop(app=app, clock=clock, gateway=gateway)
            shop.run(_pay_order(shop), "order:1001", 1000, states=("COMPLETED",))
    finally:
        gateway.close()
        for app in apps:
            close_test_app(app)
    return gateway


def test_migrate_records_where_the_id_was_minted_and_a_copy_is_told(
    original_and_copy: tuple[str, str], opened: Callable[[str], SQLAlchemyStore]
) -> None:
    original_url, copy_url = original_and_copy
    migrate(copy_url)  # a deploy on the copy: never moves the place to the copy
    original, copy = place_of(opened(original_url)), place_of(opened(copy_url))
    assert original.recorded is not None and original.recorded == original.current
    assert not original.is_copy
    assert copy.deployment_id == original.deployment_id, "a copy carries the id (the hazard)"
    assert copy.recorded == original.recorded and copy.current != original.current
    assert copy.is_copy, "a copied store must be told it is a copy"
    assert "--new-deployment-id" in copy.copy_warning()
    assert "--same-deployment" in copy.copy_warning()


def test_a_worker_on_a_copy_warns_once_and_still_starts(
    original_and_copy: tuple[str, str],
    opened: Callable[[str], SQLAlchemyStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    original_url, copy_url = original_and_copy
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):
        assert read_store_tenant(opened(original_url)) is not None
        assert not [r for r in caplog.records if "is a copy" in r.getMessage()]
        tenant = read_store_tenant(opened(copy_url))
    assert tenant == read_store_tenant(opened(original_url)), "never refused: a restore starts"
    warned = [r for r in caplog.records if "this store is a copy" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING


def test_a_copy_with_a_new_id_charges_its_own_customer(
    original_and_copy: tuple[str, str], opened: Callable[[str], SQLAlchemyStore]
) -> None:
    original_url, copy_url = original_and_copy
    old, new = new_deployment_id(opened(copy_url), actor="test")
    assert old == read_store_tenant(opened(original_url)) and new != old
    assert len(new) == 10 and new.isalnum() and new.islower()
    assert not place_of(opened(copy_url)).is_copy, "the new id was minted here"
    for store in (opened(original_url), opened(copy_url)):
        store.close()  # a PostgreSQL original stays copyable; the apps open their own
    gateway = _both_pay_order_1001(original_url, copy_url)
    charges = [r for r in gateway.requests if r.operation == "charge"]
    assert len({r.idempotency_key for r in charges}) == 2
    assert len(gateway.payments) == 2, "each deployment's customer charged once"


def test_without_a_new_id_the_copy_is_paid_with_the_original_s_payment(
    original_and_copy: tuple[str, str],
) -> None:
    """The hazard itself, counted at the gateway: what the docs now warn about."""
    gateway = _both_pay_order_1001(*original_and_copy)
    assert len(gateway.payments) == 1
    assert [r.outcome.value for r in gateway.requests if r.operation == "charge"] == [
        "PROCESSED",
        "REPLAYED",
    ]


def _add_execution(url: str, state: str) -> None:
    store = SQLAlchemyStore(url)
    now = time.time_ns() // 1_000_000
    try:
        with store.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO agboss_executions (id, task_name, state, args, kwargs, "
                    "options, requested_at_ms, updated_at_ms) VALUES ('exec-1', 'shop.pay', "
                    ":state, '[]', '{}', '{}', :now, :now)"
                ),
                {"state": state, "now": now},
            )
    finally:
        store.close()


def test_a_new_id_is_refused_while_an_execution_is_in_flight(
    original_and_copy: tuple[str, str], opened: Callable[[str], SQLAlchemyStore]
) -> None:
    _original_url, copy_url = original_and_copy
    _add_execution(copy_url, "WAITING")
    before = read_store_tenant(opened(copy_url))
    with pytest.raises(OperatorRefusedError) as refused:
        new_deployment_id(opened(copy_url), actor="test")
    assert refused.value.code == "in-flight"  # type: ignore[attr-defined]
    assert "exec-1" in str(refused.value) and "finish" in str(refused.value)
    assert read_store_tenant(opened(copy_url)) == before, "nothing changed"
    assert place_of(opened(copy_url)).is_copy
    store = opened(copy_url)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE agboss_executions SET state = 'COMPLETED'"))
    assert new_deployment_id(store, actor="test")[1] != before


def test_same_deployment_records_a_restore_s_place_and_keeps_the_id(
    original_and_copy: tuple[str, str], opened: Callable[[str], SQLAlchemyStore]
) -> None:
    original_url, copy_url = original_and_copy
    kept = read_store_tenant(opened(original_url))
    assert same_deployment(opened(copy_url)).is_copy
    after = place_of(opened(copy_url))
    assert not after.is_copy and after.deployment_id == kept
    migrate(copy_url)
    assert not place_of(opened(copy_url)).is_copy


def test_a_new_id_is_refused_while_an_intent_is_pending(
    original_and_copy: tuple[str, str], opened: Callable[[str], SQLAlchemyStore]
) -> None:
    """A pending intent of a finished execution (a reconcile still to come) keeps its key."""
    _original_url, copy_url = original_and_copy
    store = opened(copy_url)
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO agboss_outbound_calls (idempotency_key, execution_id, name, "
                "fingerprint, request, result, status, attempt, sent_by) VALUES "
                "('k:b:order%3A1:shop.charge', 'exec-1', 'shop.charge', 'f', '{}', 'null', "
                "'PENDING', 1, 'exec-1')"
            )
        )
    before = read_store_tenant(store)
    with pytest.raises(OperatorRefusedError, match="1 intent\\(s\\) pending"):
        new_deployment_id(store, actor="test")
    assert read_store_tenant(store) == before


# --- one SQLite file reached by two paths is one store -------------------------------


def _sqlite_place_of(path: Path) -> PlaceCheck:
    store = SQLAlchemyStore(f"sqlite:///{path}")
    try:
        return place_of(store)
    finally:
        store.close()


def _two_paths_to_one_file(tmp_path: Path) -> tuple[Path, Path]:
    """A migrated SQLite file and a second path to it (a hard link: what two containers
    mounting one volume at different paths see)."""
    (tmp_path / "web").mkdir()
    (tmp_path / "worker").mkdir()
    web, worker = tmp_path / "web" / "shop.db", tmp_path / "worker" / "shop.db"
    migrate(f"sqlite:///{web}")
    os.link(web, worker)
    return web, worker


def test_one_sqlite_file_reached_by_two_paths_is_one_store(tmp_path: Path) -> None:
    """It was a copy from one of the paths, and ``--same-deployment`` there only moved the
    warning to the other: the file (device, inode) is the place now, not its path."""
    web, worker = _two_paths_to_one_file(tmp_path)
    assert not _sqlite_place_of(web).is_copy
    assert not _sqlite_place_of(worker).is_copy
    store = SQLAlchemyStore(f"sqlite:///{worker}")
    try:
        same_deployment(store)
    finally:
        store.close()
    assert not _sqlite_place_of(web).is_copy and not _sqlite_place_of(worker).is_copy
    copied = tmp_path / "copied.db"
    shutil.copy(web, copied)
    copy = _sqlite_place_of(copied)
    assert copy.is_copy, "a copied file is still a copy"
    assert str(copied) in copy.copy_warning(), "the operator reads the path"


def test_a_place_recorded_in_the_path_only_form_still_compares(tmp_path: Path) -> None:
    """A store migrated by the version before recorded ``sqlite:<path>``: the file that
    path reaches is the same store (from either path), a copied file is not, and the next
    migrate writes the place in the file's form."""
    web, worker = _two_paths_to_one_file(tmp_path)
    copied = tmp_path / "copied.db"
    shutil.copy(web, copied)
    old_form = f"sqlite:{os.path.realpath(web)}"
    for path in (web, copied):
        store = SQLAlchemyStore(f"sqlite:///{path}")
        try:
            with store.engine.begin() as conn:
                conn.execute(
                    text("UPDATE agboss_meta SET value = :v WHERE key = :k"),
                    {"v": old_form, "k": PLACE_META_KEY},
                )
        finally:
            store.close()
    assert not _sqlite_place_of(web).is_copy and not _sqlite_place_of(worker).is_copy
    assert _sqlite_place_of(copied).is_copy
    migrate(f"sqlite:///{worker}")
    upgraded = _sqlite_place_of(web)
    assert upgraded.recorded is not None and upgraded.recorded != old_form
    assert upgraded.recorded.startswith("sqlite-file:") and not upgraded.is_copy
    assert not _sqlite_place_of(worker).is_copy
    migrate(f"sqlite:///{copied}")
    assert _sqlite_place_of(copied).recorded == old_form, "a copy never takes the place"
