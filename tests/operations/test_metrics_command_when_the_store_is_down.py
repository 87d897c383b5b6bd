"""``agboss metrics`` with the store down exits 0 and says so in its exposition
(docs/metrics.md): a textfile collector's ``… && mv`` writes the file that alerts
(``agboss_store_up 0``) instead of keeping the last one, stale, saying all is well.
``agboss pending`` exits 4 there, as every other command."""

from __future__ import annotations

from celery_agboss.cli import EXIT_CONFIGURATION
from celery_agboss.testing.celery_app import close_test_app, make_test_app
from tests.operations.cli import run

UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/none"


def test_metrics_prints_store_up_0_and_exits_0_where_pending_exits_4() -> None:
    app = make_test_app(UNREACHABLE, config={"agboss_pseudonym_key": "k" * 32})
    try:
        metrics = run(app, "metrics")
        pending = run(app, "pending")
    finally:
        close_test_app(app)
    assert metrics.exit_code == 0
    assert "agboss_store_up 0.0" in metrics.output
    assert "agboss_intents_needing_operator " not in metrics.output, "no stale gauge"
    assert pending.exit_code == EXIT_CONFIGURATION
