"""An undo and a replay of one shared record never both win
(design: undo outcomes), across two processes.

A (the first click) charged the order and now fails: its undo of the charge is decided
and, when nobody else relies on the charge, claimed by a compare-and-set on the intent
row. B (the second click) reaches the same business-keyed charge: its replay writes its
reliance on the row by a compare-and-set that an undo's claim makes fail. The two are
released together by a barrier, on both stores, many times; then, on PostgreSQL (where
two write transactions run at once; SQLite runs one at a time, so the interleavings
below cannot happen there), each side is held between its read and its write until the
other committed, both ways round, beside the twin that takes the reliance off the row
and shows both winning: a second click handed the receipt of a charge being refunded.
"""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from celery_agboss.core.execution_context import ExecutionContext
from celery_agboss.core.executions import ExecutionMessage
from celery_agboss.core.keys import business_key as business_key_of
from celery_agboss.core.protections import RELIANCE_OFF_THE_RECORD
from celery_agboss.core.shared_records import relies
from celery_agboss.core.store_protocol import INTENT_RECORD, SharedRecord
from celery_agboss.store.execution_store import SQLAlchemyExecutionStore
from celery_agboss.store.sqlalchemy_store import SQLAlchemyStore
from tests.faults import workers

PSEUDONYM_KEY = b"shared-record-races-pseudonym-key"
ROUNDS = 6
TTL_MS = 30_000


@dataclass(frozen=True)
class Round:
    failing: str  # A: created and relied on the charge, now COMPENSATING
    clicking: str  # B: a second execution of the order, running
    business_key: str
    key: str


def _message(execution_id: str) -> ExecutionMessage:
    return ExecutionMessage(execution_id, "shop.place_order", "[]", "{}", "{}")


def _prepare(store_url: str, rounds: int) -> list[Round]:
    """Each round: A's charge COMPLETED (A relies on it), A COMPENSATING, B RUNNING;
    neither holds its lease."""
    store = SQLAlchemyStore(store_url)
    executions = SQLAlchemyExecutionStore(store)
    settings = workers.shared_settings(
        PSEUDONYM_KEY, send=lambda context: {"id": f"ch_{uuid.uuid4().hex[:8]}"}
    )
    call = settings.registry[workers.SHARED_CALL]
    made = []
    try:
        for _ in range(rounds):
            order = f"order:{uuid.uuid4().hex[:10]}"
            failing, clicking = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
            for execution_id in (failing, clicking):
                executions.record_requested(_message(execution_id))
                start = executions.start_delivery(_message(execution_id), "h", TTL_MS, 10)
                assert start.grant is not None
                store.release_lease(start.grant.lease)
            with ExecutionContext.start(store, failing, settings) as ctx:
                ctx.outbound(call, workers.SHARED_REQUEST, business_key=order)
                with ctx.fenced() as tx:
                    executions.compensating_in(tx, "undo after LookupError")
            key = business_key_of(settings.tenant, order, workers.SHARED_CALL)
            made.append(Round(failing, clicking, order, key))
    finally:
        store.close()
    return made


def _race(
    store_url: str, made: Round, *, hold: str = "none", sabotage: tuple[str, ...] = ()
) -> dict[str, str]:
    """Run A's undo decision and B's replay in two spawned processes, released together;
    ``hold``: which side waits between its read and its write for the other one."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    middle = ctx.Barrier(2) if hold != "none" else None
    done = ctx.Event()
    results: Any = ctx.Queue()
    common = (list(sabotage), start, middle, done, hold, results)
    processes = [
        ctx.Process(
            target=workers.shared_step,
            args=("undo", store_url, PSEUDONYM_KEY, made.failing, made.key, *common),
            daemon=True,
        ),
        ctx.Process(
            target=workers.shared_step,
            args=("replay", store_url, PSEUDONYM_KEY, made.clicking, made.business_key, *common),
            daemon=True,
        ),
    ]
    outcomes: dict[str, str] = {}
    try:
        with workers.sabotage_allowed_in_children(bool(sabotage)):
            for process in processes:
                process.start()
        for _ in processes:
            row = workers.next_row(results, 90, f"only {outcomes} of two sides reported")
            assert row["error"] is None, f"the {row['side']} side failed:\n{row['error']}"
            outcomes[row["side"]] = row["outcome"]
    finally:
        start.abort()
        if middle is not None:
            middle.abort()
        workers.stop_all(processes)
    return outcomes


def _record(store_url: str, key: str) -> SharedRecord:
    store = SQLAlchemyStore(store_url)
    try:
        with store.read_transaction() as tx:
            found = tx.read_shared(INTENT_RECORD, key)
    finally:
        store.close()
    assert found is not None
    return found


def _both_won(record: SharedRecord, made: Round) -> bool:
    """The undo claimed the charge while B's replay was handed its receipt."""
    return record.undo_by == made.failing and relies(record, made.clicking)


@pytest.fixture
def rounds(store_url: str) -> Iterator[list[Round]]:
    yield _prepare(store_url, ROUNDS)


def test_an_undo_and_a_replay_released_together_never_both_win(
    store_url: str, rounds: list[Round]
) -> None:
    for made in rounds:
        outcomes = _race(store_url, made)
        record = _record(store_url, made.key)
        assert not _both_won(record, made), outcomes
        if record.undo_by is None:
            assert outcomes == {"undo": "WAIT", "replay": "relied"}
        else:
            assert outcomes == {"undo": "UNDO", "replay": "compensated"}


postgresql_only = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)


@postgresql_only
@pytest.mark.parametrize(
    ("hold", "expected"),
    [
        pytest.param(
            "undo",
            {"undo": "WAIT", "replay": "relied"},
            id="a_replay_committed_between_the_undo_s_decision_and_its_claim_makes_it_wait",
        ),
        pytest.param(
            "replay",
            {"undo": "UNDO", "replay": "compensated"},
            id="an_undo_claimed_between_the_replay_s_read_and_its_write_refuses_the_replay",
        ),
    ],
)
def test_a_side_held_between_its_read_and_its_write_loses_to_the_other_s_commit(
    store_url: str, rounds: list[Round], hold: str, expected: dict[str, str]
) -> None:
    """The held side re-checks the record the other side committed meanwhile: exactly
    one of the undo and the replay wins, the record says which."""
    made = rounds[0]
    outcomes = _race(store_url, made, hold=hold)
    record = _record(store_url, made.key)
    assert outcomes == expected
    undone = expected["undo"] == "UNDO"
    assert record.undo_by == (made.failing if undone else None)
    assert relies(record, made.clicking) is not undone


@postgresql_only
@pytest.mark.parametrize("hold", ["undo", "replay"])
def test_twin_a_reliance_off_the_record_lets_the_undo_and_the_replay_both_win(
    store_url: str, rounds: list[Round], hold: str
) -> None:
    made = rounds[0]
    outcomes = _race(store_url, made, hold=hold, sabotage=(RELIANCE_OFF_THE_RECORD,))
    assert outcomes == {"undo": "UNDO", "replay": "relied"}
    assert _both_won(_record(store_url, made.key), made), "refunded under a relying click"
