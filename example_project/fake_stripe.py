"""``python -m example_project.fake_stripe [--port N]``: a fake Stripe for the shop to charge.

``celery_agboss.testing.FakeGatewayServer`` with its Stripe dialect: the official
``stripe`` SDK talks to it as to Stripe's API (PaymentIntents, refunds, search), and it
counts every payment it makes. It listens on 127.0.0.1 only, by design: it can never be
mistaken for, or exposed as, a real gateway (docker/compose.yaml shares its network
namespace with the services that call it). Stripe is named only to identify its public
API; no affiliation or endorsement.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Sequence

from celery_agboss.testing.dialects.stripe import StripeDialect
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer


def make_server(port: int = 0) -> FakeGatewayServer:
    gateway = FakeGateway(capabilities=StripeDialect.documented_capabilities)
    return FakeGatewayServer(gateway, dialect=StripeDialect(), port=port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=12111, help="the port on 127.0.0.1")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with make_server(args.port) as server:
        print(f"fake Stripe listening on {server.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
