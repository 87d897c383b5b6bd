"""``agboss_outbox_grace``: how long a committed outbox row is left to its delivery before
the sweep publishes it, on both stores, in a worker thread.

The broker refuses the receipts' publish (``send_task`` raises for them), as a worker
dying between its commit and its publish would leave them: committed, unpublished. The
rows enqueued without ``grace=`` (in a fenced effect, and in the application's own
transaction under the current app) carry the setting; a per-call ``grace=`` wins. The
sweep leaves them alone before the setting's grace and publishes them after it, each
once; the per-call one waits for its own (the application publishes it here).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest

from celery_agboss import outbox
from celery_agboss.core.log_events import (
    OUTBOX_PUBLISH_FAILED,
    OUTBOX_PUBLISHED,
    OUTBOX_REPUBLISHED,
)
from celery_agboss.delivery.outcomes import decode_result
from celery_agboss.errors import ConfigurationError
from celery_agboss.runtime.settings import settings_from_conf
from tests.delivery.conftest import PaymentShop

GRACE_SECONDS = 5
CALL_GRACE = 60


@pytest.fixture
def shop_config() -> dict[str, Any]:
    return {"agboss_outbox_grace": GRACE_SECONDS}


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [vars(r) for r in caplog.records if getattr(r, "event", None) == event]


def test_rows_carry_the_setting_and_the_sweep_publishes_them_after_it_not_before(
    shop: PaymentShop, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_agboss")
    ran: list[str] = []

    @shop.task()
    def send_receipt(self: Any, order: str) -> str:
        ran.append(str(self.request.id))
        return order

    @shop.task()
    def pay(self: Any, order: str) -> list[str]:
        def mark_paid(conn: Any) -> list[str]:
            return [
                outbox.enqueue(conn, send_receipt.s(order)),
                outbox.enqueue(conn, send_receipt.s(f"{order}-late"), grace=CALL_GRACE),
            ]

        return self.fenced_effect("mark-paid", mark_paid)

    send_task = shop.app.send_task

    def refusing(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == send_receipt.name:
            raise ConnectionError("the broker refused the receipt")
        return send_task(name, *args, **kwargs)

    monkeypatch.setattr(shop.app, "send_task", refusing)
    with shop.worker():
        record = shop.wait_state(str(pay.delay("o-1").id), "COMPLETED")
        in_effect, per_call = decode_result(record.result)
        with shop.agboss.store.engine.begin() as conn:  # under the worker's (current) app
            own = outbox.enqueue(conn, send_receipt.s("o-2"), key="receipt:o-2")
        graces: dict[str, float] = {}
        for task_id in (in_effect, per_call, own):
            row = outbox.read(shop.app, task_id)
            assert row is not None and not row.published
            graces[task_id] = (row.publish_after_ms - row.created_at_ms) / 1000
        assert graces == {in_effect: GRACE_SECONDS, own: GRACE_SECONDS, per_call: CALL_GRACE}
        assert [e["stage"] for e in _events(caplog, OUTBOX_PUBLISH_FAILED)] == ["send"] * 2
        monkeypatch.undo()

        assert shop.sweep(claim_tick=False).outbox_published == 0, "within the grace"
        shop.clock.advance(GRACE_SECONDS + 1)
        assert shop.sweep(claim_tick=False).outbox_published == 2
        for task_id in (in_effect, own):
            shop.wait_state(task_id, "COMPLETED")
        late = outbox.read(shop.app, per_call)
        assert late is not None and not late.published, "its own grace has not passed"
        assert _events(caplog, OUTBOX_PUBLISHED) == [], "the delivery published nothing"
        assert outbox.publish(shop.app, per_call) == [per_call]  # the application's publish
        shop.wait_state(per_call, "COMPLETED")
    assert sorted(ran) == sorted([in_effect, own, per_call]), "each once"
    (republished,) = _events(caplog, OUTBOX_REPUBLISHED)
    assert republished["count"] == 2
    assert republished["oldest_age_ms"] >= (GRACE_SECONDS + 1) * 1000
    (published,) = _events(caplog, OUTBOX_PUBLISHED)
    assert (published["execution_id"], published["count"]) == (None, 1)


@pytest.mark.parametrize("value", [-1, "soon"])
def test_a_wrong_outbox_grace_is_refused_naming_the_setting(value: Any) -> None:
    base = {"agboss_database_url": "sqlite:////var/lib/shop/agboss.db"}
    conf = {**base, "agboss_pseudonym_key": "a-pseudonym-key-of-enough-bytes"}
    with pytest.raises(ConfigurationError, match="agboss_outbox_grace") as caught:
        settings_from_conf({**conf, "agboss_outbox_grace": value}, environ={})
    assert caught.value.setting == "agboss_outbox_grace"
    read = settings_from_conf({**conf, "agboss_outbox_grace": timedelta(0)}, environ={})
    assert read.outbox_grace_seconds == 0, "zero is allowed: the sweep may publish at once"
