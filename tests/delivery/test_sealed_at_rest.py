"""Records sealed at rest (design: sealed at rest), on both stores, in a real worker.

- A charge with a pause leaves no customer text in the database's own bytes (the SQLite
  file and its WAL, a ``pg_dump``); the same run without keys shows it, so the scan can see.
- A sealed value copied into another row does not open there; its twin seals without the
  row binding, and another customer's result opens as this one's.
- A value no configured key opens makes the delivery wait, naming the key id; nothing is
  sent or failed, and the delivery completes once a process has the key.
- A store written in clear stays readable when encryption is turned on; once sealed, a
  process without keys refuses to write in clear.
- ``rotate-keys`` re-seals every column with the new first key and seals old plaintext
  (and drops the argument reprs old rows kept in their options: no argument is left in
  clear); ``verify_history`` holds across it, and the old key can then go.
- The audit of a decision names a sealed execution reason, never its text.
- A settle racing the re-seal of its row keeps its result; its twin re-seals without the
  compare-and-set and the charge's result is replaced by the old one.

Speed-ups (the delivery conftest's): Celery's in-memory broker, a worker in a thread.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, make_url, text

from celery_agboss import answer_pause, cancel
from celery_agboss.core.compensation import UndoStep
from celery_agboss.core.fault_points import RESEAL_BEFORE_WRITE
from celery_agboss.core.history import verify_history
from celery_agboss.core.log_events import EXECUTION_STORE_FAILED
from celery_agboss.core.protections import (
    RESEAL_WITHOUT_COMPARE_AND_SET,
    SEALED_WITHOUT_ROW_BINDING,
)
from celery_agboss.core.sealing import KeyRing, Sealer, key_variable
from celery_agboss.core.store_protocol import IntentGuard, IntentUpdate
from celery_agboss.errors import EncryptionKeysMissingError, SealedValueUnopenableError
from celery_agboss.operator import read_pause, redrive
from celery_agboss.operator.common import _intent_summary
from celery_agboss.store.rotation import rotate_keys
from celery_agboss.store.sealed_columns import sealed
from celery_agboss.task import undo_function
from celery_agboss.testing.fault_arming import arm_pause
from celery_agboss.testing.switches import sabotage
from tests.delivery.conftest import PaymentShop
from tests.support.processes import wait_until

NAME = "Ada Lovelace"
EMAIL = "ada.lovelace@example.test"
STREET = "Babbage Street 12"
KEYS = {name: base64.b64encode(os.urandom(32)).decode() for name in ("k1", "k2")}


def _ring(*names: str) -> KeyRing:
    return KeyRing([(name, base64.b64decode(KEYS[name])) for name in names])


@pytest.fixture(autouse=True)
def _keys_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in KEYS.items():
        monkeypatch.setenv(key_variable(name), value)


@pytest.fixture
def shop_config() -> dict[str, Any]:
    """Sealed with ``k1``; a test that starts in clear parametrizes this to ``{}``."""
    return {"agboss_encryption_keys": ["k1"]}


def _customer_order(shop: PaymentShop) -> Any:
    charge = shop.call()

    @shop.task()
    def order(self: Any, customer: str, amount: int) -> Any:
        paid = self.outbound(charge, {"amount": amount, "order": self.request.id, "email": EMAIL})
        where = self.pause("address", {"ask": f"ship to {customer}?"})
        return {"customer": customer, "payment": paid["id"], "ship_to": where}

    return order


def _paid_and_shipped(shop: PaymentShop, order: Any = None) -> str:
    order = order or _customer_order(shop)
    with shop.worker():
        execution_id = shop.deliver(order, NAME, 1200, states=("PAUSED",))
        answer_pause(shop.app, f"{execution_id}:address", {"street": STREET})
        shop.wait_state(execution_id, "COMPLETED")
    return execution_id


def _raw_database(url: str, tmp_path: Path) -> bytes:
    """What a backup holds: the SQLite file and its WAL, or a ``pg_dump`` of the database."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        # Read by another process: closing a descriptor of a SQLite file in this one
        # would drop the locks the shop's own connections hold on it.
        path = Path(str(parsed.database))
        files = [str(p) for p in (path, Path(f"{path}-wal")) if p.exists()]
        return subprocess.run(["cat", *files], check=True, capture_output=True, timeout=30).stdout
    where = ["-h", str(parsed.host), "-p", str(parsed.port or 5432), "-U", str(parsed.username)]
    dumped = subprocess.run(
        ["pg_dump", *where, "--data-only", str(parsed.database)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return dumped.stdout


def _clear_copies(url: str, secret: str) -> list[str]:
    """Every ``table.column`` of the store whose stored text holds ``secret`` as it is."""
    engine = create_engine(url)
    found = []
    try:
        with engine.connect() as conn:
            for table in inspect(conn).get_table_names():
                for row in conn.execute(text(f"SELECT * FROM {table}")).mappings():
                    found += [
                        f"{table}.{column}"
                        for column, value in row.items()
                        if isinstance(value, str) and secret in value
                    ]
    finally:
        engine.dispose()
    return found


def _texts(url: str, table: str, column: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(f"SELECT {column} FROM {table} WHERE {column} IS NOT NULL"))
            return [str(row[0]) for row in rows]
    finally:
        engine.dispose()


def test_a_sealed_store_shows_no_customer_text_at_rest(
    shop: PaymentShop, delivery_store_url: str, tmp_path: Path
) -> None:
    execution_id = _paid_and_shipped(shop)
    record = shop.execution(execution_id)
    assert NAME in (record.result or "") and STREET in (record.result or "")
    (intent,) = shop.intents(execution_id)
    assert intent.request["email"] == EMAIL  # read back through the key
    pause = read_pause(shop.app, f"{execution_id}:address")  # what the approver reads
    assert pause is not None and NAME in (pause.payload or "") and STREET in (pause.answer or "")
    assert len(shop.gateway.requests) == 1
    raw = _raw_database(delivery_store_url, tmp_path)
    for secret in (NAME, EMAIL, STREET):
        assert secret.encode() not in raw, f"{secret!r} is stored in clear"
    assert b"agbsealed:1:k1:" in raw


@pytest.mark.parametrize("shop_config", [{}], ids=["no-keys"])
def test_the_same_run_without_keys_stores_the_customer_in_clear(
    shop: PaymentShop, delivery_store_url: str, tmp_path: Path
) -> None:
    """The scan's own check: without keys the same texts are found where it looks."""
    _paid_and_shipped(shop)
    raw = _raw_database(delivery_store_url, tmp_path)
    for secret in (NAME, EMAIL, STREET):
        assert secret.encode() in raw


def _copy_result(url: str, source: str, target: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE agboss_executions SET result = "
                    "(SELECT result FROM agboss_executions WHERE id = :source) WHERE id = :target"
                ),
                {"source": source, "target": target},
            )
    finally:
        engine.dispose()


def _two_customers(shop: PaymentShop) -> tuple[str, str]:
    @shop.task()
    def receipt(self: Any, customer: str) -> Any:
        return {"customer": customer}

    with shop.worker():
        first = shop.deliver(receipt, NAME, states=("COMPLETED",))
        second = shop.deliver(receipt, "Grace Hopper", states=("COMPLETED",))
    return first, second


def test_a_sealed_value_copied_to_another_row_does_not_open(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    first, second = _two_customers(shop)
    _copy_result(delivery_store_url, first, second)
    with pytest.raises(SealedValueUnopenableError) as raised:
        shop.agboss.executions.read_execution(second)
    assert raised.value.key_id == "k1"  # type: ignore[attr-defined]
    assert "agboss_executions.result" in str(raised.value)


def test_sealed_without_the_row_binding_a_copied_value_opens_as_another_customers(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    with sabotage(SEALED_WITHOUT_ROW_BINDING):
        first, second = _two_customers(shop)
        _copy_result(delivery_store_url, first, second)
        record = shop.execution(second)
    assert NAME in (record.result or ""), "the copy opens: Grace Hopper's receipt is Ada's"


def test_a_value_no_key_opens_makes_the_delivery_wait_naming_the_key(
    shop: PaymentShop, delivery_store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    order = _customer_order(shop)
    with shop.worker():
        execution_id = shop.deliver(order, NAME, 900, states=("PAUSED",))
    # Answered while no worker runs; the next worker starts without the key that sealed
    # the charge it must replay.
    answer_pause(shop.app, f"{execution_id}:address", {"street": STREET})
    store = shop.agboss.store
    store.sealer = Sealer(_ring("k2"))
    with caplog.at_level(logging.ERROR, logger="celery_agboss"), shop.worker():
        wait_until(
            lambda: any(getattr(r, "key_id", None) == "k1" for r in caplog.records),
            20,
            message="the delivery to name the key it lacks",
        )
        failed = [r for r in caplog.records if getattr(r, "event", None) == EXECUTION_STORE_FAILED]
        assert failed and failed[0].key_id == "k1"  # type: ignore[attr-defined]
        (state,) = _texts(delivery_store_url, "agboss_executions", "state")
        assert state in ("RUNNING", "WAITING"), "waiting, neither failed nor undone"
        store.sealer = Sealer(_ring("k2", "k1"))  # the key is given: the delivery goes on
        shop.wait_state(execution_id, "COMPLETED", timeout=40)
    assert len(shop.gateway.requests) == 1, "the charge was replayed, never sent again"


@pytest.mark.parametrize("shop_config", [{}], ids=["no-keys"])
def test_a_store_written_in_clear_stays_readable_and_is_sealed_by_rotation(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    order = _customer_order(shop)
    before = _paid_and_shipped(shop, order)
    assert any(NAME in value for value in _texts(delivery_store_url, "agboss_executions", "args"))
    store = shop.agboss.store
    store.sealer = Sealer(_ring("k1"))  # encryption turned on: old rows read as they are
    assert NAME in (shop.execution(before).result or "")
    after = _paid_and_shipped(shop, order)
    report = rotate_keys(store, batch_size=2)
    assert report.complete and report.total > 0, report
    for table, column in (("agboss_executions", "args"), ("agboss_outbound_calls", "request")):
        values = _texts(delivery_store_url, table, column)
        assert values and all(v.startswith("agbsealed:1:k1:") for v in values), values
    for execution_id in (before, after):
        assert NAME in (shop.execution(execution_id).result or "")
    # Nor is the display copy of the arguments the old rows kept in their options left.
    assert report.resealed["agboss_executions.options"] == 1, report
    assert not _clear_copies(delivery_store_url, NAME), "an argument is left in clear"
    assert "argsrepr" not in _texts(delivery_store_url, "agboss_executions", "options")[0]
    # Once sealed, a process without keys does not write in clear: it waits.
    store.sealer = Sealer()
    with pytest.raises(EncryptionKeysMissingError), store.transaction() as tx:
        sealed(tx.connection, "agboss_executions", "result", after, '{"customer": "x"}')


def test_rotation_reseals_with_the_new_first_key_and_history_still_verifies(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    execution_id = _paid_and_shipped(shop)
    store = shop.agboss.store
    store.sealer = Sealer(_ring("k2", "k1"))
    report = rotate_keys(store, batch_size=3)
    assert report.complete and report.sealing_key == "k2"
    for table, column in (("agboss_intent_history", "detail"), ("agboss_pauses", "answer")):
        values = _texts(delivery_store_url, table, column)
        assert values and all(v.startswith("agbsealed:1:k2:") for v in values), values
    store.sealer = Sealer(_ring("k2"))  # the old key removed
    (intent,) = shop.intents(execution_id)
    rows = store.read_history(intent.idempotency_key)
    key = shop.agboss.settings.pseudonym_key
    verdict = verify_history(key, rows, idempotency_key=intent.idempotency_key)
    assert verdict.ok, verdict
    assert STREET in (shop.execution(execution_id).result or "")


@pytest.mark.parametrize("twin", [False, True], ids=["compare-and-set", "twin-without"])
def test_a_settle_racing_the_reseal_of_its_row_keeps_its_result(
    shop: PaymentShop, twin: bool
) -> None:
    order = _customer_order(shop)
    hold = shop.gateway.hold()
    with shop.worker():
        execution_id = shop.deliver(order, NAME, 700, states=("RUNNING",))
        hold.wait_reached()  # the intent is PENDING, its result column holds a sealed null
        store = shop.agboss.store
        store.sealer = Sealer(_ring("k2", "k1"))
        paused = arm_pause(
            RESEAL_BEFORE_WRITE,
            only={"table": "agboss_outbound_calls", "column": "result"},
        )
        rotation: dict[str, Any] = {}

        def rotate() -> None:
            with sabotage(RESEAL_WITHOUT_COMPARE_AND_SET) if twin else _nothing():
                rotation["report"] = rotate_keys(store)

        rotating = threading.Thread(target=rotate, name="rotate-keys")
        rotating.start()
        try:
            paused.wait_reached()
            hold.release()  # the charge answers; the worker settles its result
            settled = threading.Event()
            (intent,) = shop.intents(execution_id)
            threading.Thread(
                target=lambda: (_settled(shop, intent.idempotency_key), settled.set()),
                daemon=True,
            ).start()
            # Without the row lock (SQLite, the twin) the settle commits now; on PostgreSQL
            # it waits for the batch that locked its row.
            settled.wait(2)
        finally:
            paused.release()
            rotating.join(30)
        shop.wait_state(execution_id, "PAUSED")
    (intent,) = shop.intents(execution_id)
    if twin:
        assert intent.status.value == "COMPLETED" and intent.result is None, intent.result
        return
    assert intent.status.value == "COMPLETED" and intent.result is not None, intent
    assert intent.result.get("id"), intent.result
    assert len(shop.gateway.requests) == 1


def _settled(shop: PaymentShop, key: str) -> None:
    wait_until(
        lambda: shop.agboss.store.read_intent(key).status.value == "COMPLETED",  # type: ignore[union-attr]
        20,
        message="the charge to be settled",
    )


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_an_executions_reasons_are_sealed_and_read_back(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    """A cancel's reason is the canceller's words; an undo's failure quotes its error."""
    order = _customer_order(shop)
    with shop.worker():
        execution_id = shop.deliver(order, NAME, 300, states=("PAUSED",))
    why = f"{NAME} called to cancel"
    record = cancel(shop.app, execution_id, why, payments_handled=True)
    assert record.state.value == "CANCELLED" and record.cancel_reason == why
    for column in ("reason", "cancel_reason"):
        (stored,) = _texts(delivery_store_url, "agboss_executions", column)
        assert stored.startswith("agbsealed:1:k1:"), (column, stored)
    assert shop.execution(execution_id).cancel_reason == why


def test_an_operator_reason_quoting_a_reconcile_is_sealed_and_the_audit_names_only_the_decision(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    execution_id = _paid_and_shipped(shop)
    (intent,) = shop.intents(execution_id)
    store = shop.agboss.store
    guard = IntentGuard(status=intent.status, attempt=intent.attempt, owner=None, any_owner=True)
    why = f"unknown: the gateway says {EMAIL} is under review"
    with store.transaction() as tx:
        assert tx.update_intent(intent.idempotency_key, guard, IntentUpdate(operator_reason=why))
    (stored,) = _texts(delivery_store_url, "agboss_outbound_calls", "operator_reason")
    assert stored.startswith("agbsealed:1:k1:") and store.read_intent(intent.idempotency_key)
    assert shop.intents(execution_id)[0].operator_reason == why
    assert _intent_summary(shop.intents(execution_id)[0])["operator_reason"] == "unknown"


def test_an_undo_failure_quoted_in_the_reason_stays_sealed_in_the_audit(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    """The execution's reason is sealed (an undo's failure quotes its error there); the
    audit of a decision on it, kept in clear, names the reason only."""

    @undo_function(shop.app, "refund-charge")
    def refund_charge(task: Any, undo: UndoStep, payment: str) -> None:
        raise RuntimeError(f"refund refused: the card of {EMAIL} was closed")

    pay = shop.pay_failing_after_its_charge("refund-charge")

    execution_id = shop.run(pay, "o-1", states=("WAITING_OPERATOR",))
    (reason,) = _texts(delivery_store_url, "agboss_executions", "reason")
    assert reason.startswith("agbsealed:1:k1:")
    redrive(shop.app, execution_id, "refund API is back", actor="oncall")
    (audit,) = shop.agboss.executions.list_audit(execution_id)
    assert json.loads(audit.before or "")["reason"] == "undo refund-charge failed"
    assert EMAIL not in f"{audit.before} {audit.after}", "the sealed reason is copied in clear"
    assert _clear_copies(delivery_store_url, EMAIL) == []


@pytest.mark.xfail(
    strict=True,
    reason="a link's, chain's or errback's arguments stay in the clear options column: "
    "sealing them needs a format change (docs/security.md, execution options)",
)
def test_a_linked_tasks_arguments_are_not_stored_in_clear(
    shop: PaymentShop, delivery_store_url: str
) -> None:
    charge = shop.call()

    @shop.task()
    def pay(self: Any, order: str, customer: str) -> Any:
        return self.outbound(charge, {"amount": 1000, "order": order})

    @shop.task()
    def ship(self: Any, receipt: Any, customer: str, street: str) -> Any:
        return {"shipped": receipt["id"]}

    with shop.worker():
        result = pay.apply_async(("o-1", NAME), link=ship.s(NAME, STREET))
        shop.wait_state(str(result.id), "COMPLETED")
    assert _clear_copies(delivery_store_url, STREET) == []
