"""``reconcile_stranded``: the sweep's side of reconcile (design: sweep reconciles). It
takes a PENDING intent with no live owner under its own short lease, stores Completed,
records NotSent as ``not_sent_confirmed`` and flags Unknown — and never sends."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from celery_agboss.core.engine_settings import EngineSettings
from celery_agboss.core.history import HistoryEvent, verify_history
from celery_agboss.core.lease import acquire
from celery_agboss.core.log_events import OUTBOUND_CALL_LOOKUP_FAILED
from celery_agboss.core.outbound import CallContext, Completed, Lookup, OutboundCall, Outcome
from celery_agboss.core.store_protocol import IntentStatus
from celery_agboss.core.stranded import StrandedOutcome, reconcile_stranded
from celery_agboss.errors import OutboundCallOutcomeUnknownError
from celery_agboss.testing.fault_arming import OUTBOUND_AFTER_SEND, OUTBOUND_BEFORE_SEND, arm_raise
from tests.engine.helpers import Crash, Shop, step_intent_key


def _stranded(shop: Shop, point: str, reconcile: Any = "lookup") -> str:
    charge = shop.charge_call(reconcile=reconcile)
    dead = shop.start("task-1")
    arm_raise(point, Crash, only={"holder": dead.lease_ref.holder})
    with pytest.raises(Crash):
        dead.outbound(charge, {"amount": 700})
    shop.expire_leases()
    return step_intent_key(shop.settings, "task-1", "fake.charge")


def _sweep(
    shop: Shop, key: str, settings: EngineSettings | None = None, by: str = "sweep"
) -> StrandedOutcome:
    sweeper = acquire(shop.store, "agboss-sweep-test", ttl_ms=10_000)
    assert sweeper is not None
    try:
        return reconcile_stranded(
            shop.store, settings or shop.settings, key, sweeper_lease=sweeper, by=by
        )
    finally:
        shop.store.release_lease(sweeper.ref)


def test_the_sweep_stores_a_payment_it_finds_and_the_next_delivery_replays_it(shop: Shop) -> None:
    key = _stranded(shop, OUTBOUND_AFTER_SEND)
    assert _sweep(shop, key) is StrandedOutcome.COMPLETED
    record = shop.store.read_intent(key)
    assert record is not None and record.status is IntentStatus.COMPLETED
    with shop.start("task-1") as redriven:
        redriven.outbound(shop.settings.registry["fake.charge"], {"amount": 700})
        assert redriven.last_outcome is Outcome.REPLAYED
    assert len(shop.gateway.requests) == 1


def test_the_sweep_records_not_sent_and_never_sends(shop: Shop) -> None:
    key = _stranded(shop, OUTBOUND_BEFORE_SEND)
    assert _sweep(shop, key) is StrandedOutcome.NOT_SENT_CONFIRMED
    assert shop.gateway.requests == []
    record = shop.store.read_intent(key)
    assert record is not None
    assert record.status is IntentStatus.PENDING and record.not_sent_confirmed
    assert record.owner is None
    with shop.start("task-1") as redriven:  # the execution's holder decides the resend
        redriven.outbound(shop.settings.registry["fake.charge"], {"amount": 700})
        assert redriven.last_outcome is Outcome.SENT
    assert len(shop.gateway.payments) == 1


def test_the_sweep_flags_an_unknown_outcome_for_an_operator(shop: Shop) -> None:
    key = _stranded(shop, OUTBOUND_AFTER_SEND, reconcile="unknown")
    assert _sweep(shop, key) is StrandedOutcome.UNRECONCILED
    record = shop.store.read_intent(key)
    assert record is not None
    assert record.status is IntentStatus.PENDING and record.needs_operator
    assert record.next_lookup_at_ms is not None  # looked up again later, backing off
    assert len(shop.gateway.requests) == 1


def test_the_sweep_leaves_an_intent_whose_owner_is_alive(shop: Shop) -> None:
    charge = shop.charge_call()
    alive = shop.start("task-1")
    arm_raise(OUTBOUND_BEFORE_SEND, Crash, only={"holder": alive.lease_ref.holder})
    with pytest.raises(Crash):
        alive.outbound(charge, {"amount": 700})
    key = step_intent_key(shop.settings, "task-1", "fake.charge")
    assert _sweep(shop, key) is StrandedOutcome.SKIPPED


def test_the_sweep_skips_an_intent_of_a_call_it_does_not_know(shop: Shop) -> None:
    """Neither registered with the sweep's app nor declared once in the process: two
    declarations of the name leave only an explicit registration to say which is meant."""
    key = _stranded(shop, OUTBOUND_AFTER_SEND)
    same_name = shop.charge_call()  # a second declaration of "fake.charge"
    other = EngineSettings(pseudonym_key=shop.settings.pseudonym_key)
    assert _sweep(shop, key, other) is StrandedOutcome.UNKNOWN_CALL
    record = shop.store.read_intent(key)
    assert record is not None and record.status is IntentStatus.PENDING
    del same_name


def test_a_sweep_in_a_process_that_never_used_the_call_finds_it_by_its_declaration(
    shop: Shop,
) -> None:
    """A worker's main process sweeping never ran the task: importing the app's module
    declared the call, and that is enough to reconcile with it."""
    name = f"solo.charge_{uuid.uuid4().hex[:8]}"
    call = OutboundCall(
        name=name,
        send=lambda c: shop.gateway.charge(700, c.idempotency_key),
        reconcile=lambda c, lookup: Completed(shop.gateway.lookup(lookup.idempotency_key)),
        key_retention=86400,
    )
    dead = shop.start("task-1")
    arm_raise(OUTBOUND_AFTER_SEND, Crash, only={"holder": dead.lease_ref.holder})
    with pytest.raises(Crash):
        dead.outbound(call, {"amount": 700})
    shop.expire_leases()
    key = step_intent_key(shop.settings, "task-1", name)
    elsewhere = EngineSettings(pseudonym_key=shop.settings.pseudonym_key)
    assert name not in elsewhere.registry
    assert _sweep(shop, key, elsewhere) is StrandedOutcome.COMPLETED
    assert elsewhere.registry[name] is call


def _lookup_breaks(call: CallContext, lookup: Lookup) -> Any:
    raise ConnectionError("the gateway's lookup endpoint is down")


class GatewayHTTPError(Exception):
    """What an SDK raises for an HTTP 500: its text names the URL (and the key)."""

    def __init__(self, url: str) -> None:
        super().__init__(f"500 Server Error: Internal Server Error for url: {url}")
        self.response = type("Response", (), {"status_code": 500})()


def _lookup_answers_500(call: CallContext, lookup: Lookup) -> Any:
    raise GatewayHTTPError(f"https://gateway.example/charges?key={lookup.idempotency_key}")


def _lookup_failed_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == OUTBOUND_CALL_LOOKUP_FAILED]


def test_a_delivery_whose_lookup_fails_logs_the_lookups_error_not_only_its_own_wait(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    """The holder's reconcile raises the execution's "outcome unknown"; the log says
    why: the lookup's error type and the HTTP status it carried. Never the error's text
    (it names the key, which holds the business key): that is in the masked history."""
    key = _stranded(shop, OUTBOUND_AFTER_SEND, reconcile=_lookup_answers_500)
    with (
        caplog.at_level(logging.INFO, logger="celery_agboss"),
        shop.start("task-1") as redriven,
        pytest.raises(OutboundCallOutcomeUnknownError),
    ):
        redriven.outbound(shop.settings.registry["fake.charge"], {"amount": 700})
    (line,) = _lookup_failed_lines(caplog)
    assert line.levelno == logging.WARNING
    assert line.error_type.endswith("GatewayHTTPError")  # type: ignore[attr-defined]
    assert line.http_status == 500  # type: ignore[attr-defined]
    assert line.by == "holder" and line.reason == "reconcile-raised"  # type: ignore[attr-defined]
    assert "Server Error" not in line.getMessage() and "gateway.example" not in line.getMessage()
    assert shop.store.read_history(key)[-1].detail["http_status"] == 500


def test_the_sweeps_failed_lookup_names_the_http_status_too(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    key = _stranded(shop, OUTBOUND_AFTER_SEND, reconcile=_lookup_answers_500)
    with caplog.at_level(logging.INFO, logger="celery_agboss"):
        assert _sweep(shop, key) is StrandedOutcome.LOOKUP_FAILED
    (line,) = _lookup_failed_lines(caplog)
    assert line.http_status == 500 and line.by == "sweep"  # type: ignore[attr-defined]


def test_a_failed_lookup_hands_the_intent_back_with_a_history_row(shop: Shop) -> None:
    key = _stranded(shop, OUTBOUND_AFTER_SEND, reconcile=_lookup_breaks)
    assert _sweep(shop, key) is StrandedOutcome.LOOKUP_FAILED
    record = shop.store.read_intent(key)
    assert record is not None and record.status is IntentStatus.PENDING
    assert record.owner is None and record.lookup_failures == 1
    rows = shop.store.read_history(key)
    last = rows[-1]
    assert last.event == HistoryEvent.LOOKUP_FAILED.value
    assert (last.from_status, last.to_status) == ("PENDING", "PENDING")
    assert last.detail["by"] == "sweep" and last.detail["reason"] == "reconcile-raised"
    assert last.detail["lookup_failures"] == 1
    verdict = verify_history(
        shop.settings.pseudonym_key, rows, expected_last_status=IntentStatus.PENDING
    )
    assert verdict.ok, verdict.reason
    assert len(shop.gateway.requests) == 1


def test_a_reconcile_names_who_asked_in_its_history(shop: Shop) -> None:
    key = _stranded(shop, OUTBOUND_AFTER_SEND)
    assert _sweep(shop, key, by="cancel") is StrandedOutcome.COMPLETED
    rows = shop.store.read_history(key)
    taken, found = rows[-2], rows[-1]
    assert taken.event == HistoryEvent.TAKEN_FOR_RECONCILE.value
    assert found.event == HistoryEvent.RECONCILED_COMPLETED.value
    assert taken.detail["by"] == found.detail["by"] == "cancel"


def _next_lookup_in_seconds(shop: Shop, key: str) -> float:
    record = shop.store.read_intent(key)
    assert record is not None and record.next_lookup_at_ms is not None
    return (record.next_lookup_at_ms - record.read_at_ms) / 1000


def _not_sent_lookups(shop: Shop, times: int) -> list[float]:
    """An intent never processed whose execution does not run again: the sweep keeps
    finding it, and each lookup answers ``NotSent``."""
    key = _stranded(shop, OUTBOUND_BEFORE_SEND)
    delays = []
    for _ in range(times):
        assert _sweep(shop, key) is StrandedOutcome.NOT_SENT_CONFIRMED
        delays.append(_next_lookup_in_seconds(shop, key))
        shop.clock.advance(delays[-1] + 1)
    return delays


def test_lookups_that_keep_answering_not_sent_back_off_to_the_cap(shop: Shop) -> None:
    delays = _not_sent_lookups(shop, 4)
    assert [round(d) for d in delays] == [30, 60, 120, 240]
    assert shop.gateway.requests == [], "the sweep never sends"


def test_without_back_off_a_not_sent_intent_is_looked_up_every_30_seconds(shop: Shop) -> None:
    from celery_agboss.core.protections import NOT_SENT_LOOKUPS_NOT_BACKED_OFF
    from celery_agboss.testing.switches import sabotage

    with sabotage(NOT_SENT_LOOKUPS_NOT_BACKED_OFF):
        delays = _not_sent_lookups(shop, 3)
    assert [round(d) for d in delays] == [30, 30, 30]
