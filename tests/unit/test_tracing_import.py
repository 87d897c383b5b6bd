"""Without ``opentelemetry-api``, tracing costs nothing (design: tracing).

A fresh interpreter whose import system refuses ``opentelemetry`` (and counts how often it
is asked) builds an app and runs a delivery with two outbound calls and a fenced effect:
``opentelemetry`` was asked for once (when ``AGBoss`` was made), nothing of it is
imported, tracing is off and no event observer was added for it. The same script with
the package importable proves the check can fail: tracing is on there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery_agboss.store.migrate import migrate
from celery_agboss.testing.stores import sqlite_store_url
from tests.support.processes import last_json_line, run_python

_SCRIPT = """
import importlib.abc
import json
import sys

asked = []
BLOCK = {block}


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "opentelemetry":
            asked.append(name)
            if BLOCK:
                raise ImportError(f"{{name}} refused by test_tracing_import", name=name)
        return None


sys.meta_path.insert(0, Blocker())

from celery_agboss import Completed, NotSent, OutboundCall, PaymentTask
from celery_agboss.core import log_events, tracing
from celery_agboss.testing.celery_app import make_test_app
from celery_agboss.testing.gateway import FakeGateway

gateway = FakeGateway()
app = make_test_app({url!r})
call = OutboundCall(
    name="shop.charge",
    send=lambda ctx: gateway.charge(ctx.request["amount"], ctx.idempotency_key),
    reconcile=lambda ctx, lookup: (
        NotSent() if gateway.lookup(lookup.idempotency_key) is None
        else Completed(gateway.lookup(lookup.idempotency_key))
    ),
    key_retention=86400,
)


@app.task(base=PaymentTask, bind=True, name="shop.checkout")
def checkout(self):
    first = self.outbound(call, {{"amount": 100}}, business_key="order:1")
    self.outbound(call, {{"amount": 100}}, business_key="order:1")
    self.fenced_effect("mark", lambda conn: first["id"])
    return first["id"]


asked_before = len(asked)
checkout.apply(task_id="order-1").get()
print(json.dumps({{
    "asked_at_setup": asked_before,
    "asked_while_running": len(asked) - asked_before,
    "loaded": sorted(m for m in sys.modules if m.partition(".")[0] == "opentelemetry"),
    "installed": tracing.installed(),
    "observers": len(log_events._observers),
    "payments": len(gateway.payments),
}}))
"""


def _run(tmp_path: Path, *, block: bool) -> dict[str, Any]:
    url = sqlite_store_url(tmp_path)
    migrate(url)
    return last_json_line(run_python("-c", _SCRIPT.format(block=block, url=url), timeout=120))


def test_without_opentelemetry_nothing_is_imported_or_observed(tmp_path: Path) -> None:
    report = _run(tmp_path, block=True)
    assert report["payments"] == 1
    assert report["asked_at_setup"] == 1, "asked once, when the app was made"
    assert report["asked_while_running"] == 0, "never again, per call"
    assert report["loaded"] == []
    assert report["installed"] is False
    assert report["observers"] == 0


def test_with_opentelemetry_importable_tracing_is_on(tmp_path: Path) -> None:
    """The blocker's twin: the same script, the package importable."""
    report = _run(tmp_path, block=False)
    assert report["installed"] is True
    assert report["loaded"] != [] and report["observers"] == 1
