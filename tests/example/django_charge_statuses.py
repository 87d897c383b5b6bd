"""``python -m tests.example.django_charge_statuses DIR``: the Django shop's ``charge_order``
answered at a status that took no money yet, and what it made of each order; JSON on stdout.

Run in a process of its own (by ``test_charge_statuses.py``): it configures Django with
the shop's own settings (``proj.settings``, its folder first on ``sys.path`` as
``manage.py`` puts it), on a SQLite file in ``DIR``, the in-memory broker, and the fake
Stripe (``FakeGatewayServer``), whose PaymentIntents are rendered as
``charge_statuses.StripeIntents`` says. ``migrate`` makes the tables; each charge runs in
this thread (``apply``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import celery_agboss.testing.dialects.stripe as stripe_dialect
import celery_agboss.testing.dialects.stripe_wire as stripe_wire
from celery_agboss.testing.dialects.stripe import StripeDialect
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer
from tests.example.charge_statuses import AMOUNT, UNPAID, StripeIntents
from tests.example.support import REPO_ROOT

DJANGO_SHOP = REPO_ROOT / "example_project" / "django_shop"


def run(data_dir: Path) -> dict[str, Any]:
    intents = StripeIntents()
    stripe_wire.render_intent = intents.render
    stripe_dialect.render_intent = intents.render
    gateway = FakeGateway(capabilities=StripeDialect.documented_capabilities)
    with FakeGatewayServer(gateway, dialect=StripeDialect()) as server:
        os.environ.update(
            DJANGO_SETTINGS_MODULE="proj.settings",
            DJANGO_SHOP_DATABASE=str(data_dir / "db.sqlite3"),
            CELERY_BROKER_URL="memory://",
            STRIPE_API_BASE=server.url,
        )
        sys.path.insert(0, str(DJANGO_SHOP))
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        from shop.models import Order
        from shop.tasks import charge_order

        seen: dict[str, Any] = {}
        for case, shown in {**UNPAID, "succeeded": {}}.items():
            order = Order.objects.create(checkout_token=case, amount=AMOUNT, currency="usd")
            before = sum(1 for r in gateway.requests if r.operation == "charge")
            intents.next = dict(shown)
            result = charge_order.apply((order.pk,))
            order.refresh_from_db()
            seen[case] = {
                "succeeded": result.successful(),
                "status": order.status,
                "times_marked_paid": order.times_marked_paid,
                "charge_requests": sum(1 for r in gateway.requests if r.operation == "charge")
                - before,
            }
    return seen


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]).resolve())))
