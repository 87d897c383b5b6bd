"""``python manage.py rundemo [addrport]``: the fake Stripe, a Celery worker and
``runserver``, until Ctrl-C.

The fake Stripe is celery_agboss's ``FakeGatewayServer`` with its Stripe dialect, in this
process, on 127.0.0.1 only: the official ``stripe`` SDK talks to it as to Stripe's API,
and this command prints every charge request that reaches it, so a charge sent twice
would show. The worker (``celery -A proj worker``) and ``runserver`` are child processes
given its address. No beat: the worker runs celery_agboss's sweep itself when no beat
does. Stripe is named only to identify its public API; no affiliation or endorsement.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from celery_agboss.testing.dialects.stripe import StripeDialect
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_handler import GatewayCall
from celery_agboss.testing.gateway_server import FakeGatewayServer

STOP_SECONDS = 20.0


class FakeStripe(FakeGatewayServer):
    """The fake Stripe, saying each charge request as it arrives."""

    def __init__(self, port: int, say: Any) -> None:
        gateway = FakeGateway(capabilities=StripeDialect.documented_capabilities)
        super().__init__(gateway, dialect=StripeDialect(), port=port)
        self.say = say

    def charge_arrived(self, call: GatewayCall, key: str | None, reference: str | None) -> None:
        super().charge_arrived(call, key, reference)
        self.say(f"fake Stripe: charge request {len(self.charges_seen)} arrived, for {reference}")


class Command(BaseCommand):
    help = "Run the fake Stripe, a Celery worker and runserver together, until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")
        parser.add_argument("--fake-stripe-port", type=int, default=12111)
        parser.add_argument("--concurrency", type=int, default=2, help="worker processes")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        with FakeStripe(options["fake_stripe_port"], self.say) as stripe:
            self.say(f"fake Stripe listening on {stripe.url}")
            env = {**os.environ, "STRIPE_API_BASE": stripe.url, "PYTHONUNBUFFERED": "1"}
            worker = ["-m", "celery", "-A", "proj", "worker", "-l", "INFO"]
            web = ["manage.py", "runserver", options["addrport"], "--noreload", "--insecure"]
            concurrency = ["-c", str(options["concurrency"])]
            children = {
                "the worker": self.child([*worker, *concurrency], env),
                "runserver": self.child(web, env),
            }
            try:
                while not stop.wait(0.2):
                    ended = [name for name, child in children.items() if child.poll() is not None]
                    if ended:
                        self.say(f"{ended[0]} ended; stopping the rest")
                        break
            finally:
                for child in children.values():
                    self.end(child)

    def child(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, *argv], cwd=settings.BASE_DIR, env=env)

    def end(self, child: subprocess.Popen[bytes]) -> None:
        """SIGTERM (the worker's warm shutdown: it finishes what it runs), then SIGKILL."""
        if child.poll() is None:
            child.terminate()
        try:
            child.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()
