"""``python -m example_project.web [--host H] [--port N]``: the shop's HTTP entry point.

The smallest thing a browser and a gateway can reach, on the standard library's WSGI
server: place an order, come back from 3-D Secure, and receive Stripe's webhooks.

- ``POST /orders`` ``{"order_id", "amount", "flow": "charge" | "3ds" | "saga"}`` stores the
  order and publishes its task under a task id made of the order (``order-<id>``): a
  double click or a proxy's retry is the same execution, not a second one.
- ``GET /return?order=<id>`` (the 3-D Secure return page) answers the checkout's pause
  (its first wait not answered yet: ``answer_checkout``).
- ``POST /webhooks/stripe`` verifies ``Stripe-Signature`` over the raw body (400 and
  nothing recorded when it does not verify), answers the checkout's pause, or the saga's
  wait for its charge, when the event says how the payment ended (``OUTCOMES``:
  authorised, succeeded, or failed), and
  publishes one ``handle_stripe_event`` per event. An authorisation of a PaymentIntent
  whose checkout gave up (3-D Secure failed, then the customer confirmed the same
  PaymentIntent again) publishes its capture (``shop.capture_retried_checkout``), even
  when a wait took it as an early answer; one given up on after this read is captured by
  the task the checkout's give-up enqueued.
- ``GET /health``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from sqlalchemy.exc import IntegrityError

from celery_agboss import NotPausedError, answer_pause
from celery_agboss.webhooks import (
    STRIPE_SIGNATURE_HEADER,
    WebhookEvent,
    WebhookPayloadError,
    WebhookSignatureError,
    answer_pause_with_event,
    verify_stripe,
)
from example_project import config, orders, shop

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
FLOWS = {"charge": shop.charge_order, "3ds": shop.checkout_3ds, "saga": shop.place_order}
AUTHENTICATED = "payment_intent.amount_capturable_updated"
# How the customer's authentication ended (docs/webhooks.md, section 3): each answers the
# checkout's wait, whose body then reads Stripe's status itself. A failure is answered
# too, or the wait holds the checkout until it expires, an operator's to end.
# ``payment_intent.succeeded`` answers the saga's wait for a charge Stripe had not decided
# (``shop.place_order``); to a checkout (it captures manually) it comes after its capture,
# when the checkout waits no more.
OUTCOMES = frozenset(
    {
        AUTHENTICATED,
        "payment_intent.succeeded",
        "payment_intent.payment_failed",
        "payment_intent.canceled",
    }
)


def task_id_of(order_id: str) -> str:
    return f"order-{order_id}"


def _reply(start: StartResponse, status: int, body: Any) -> Iterable[bytes]:
    phrases = {200: "OK", 202: "Accepted", 400: "Bad Request", 404: "Not Found", 409: "Conflict"}
    start(f"{status} {phrases.get(status, 'Error')}", [("Content-Type", "application/json")])
    return [json.dumps(body).encode()]


def place_order(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    order_id, amount = str(body.get("order_id") or ""), body.get("amount")
    flow = body.get("flow", "charge")
    if not order_id or not isinstance(amount, int) or amount <= 0 or flow not in FLOWS:
        return 400, {
            "error": "give order_id, a positive integer amount, flow in " + ", ".join(FLOWS)
        }
    try:
        with shop.agboss.store.engine.begin() as conn:
            orders.place(conn, order_id, amount, card=str(body.get("card") or orders.DEFAULT_CARD))
    except IntegrityError:
        pass  # the same order again: its task id below makes it the same execution
    result = FLOWS[flow].apply_async((order_id,), task_id=task_id_of(order_id))
    return 202, {"order_id": order_id, "task_id": result.id}


def answer_checkout(order_id: str, answer: Callable[[str], bool]) -> bool:
    """Answer the checkout's first wait (``shop.outcome_pause``) not answered yet, up to
    ``shop.OUTCOME_ROUNDS``; later ones are an operator's. A wait answered already (the
    same event again, the return page first) passes the answer on to the next, which the
    body takes only if its reading there is still pending. True when one was answered."""
    execution_id = task_id_of(order_id)
    waits = range(1, shop.OUTCOME_ROUNDS + 1)
    return any(answer(f"{execution_id}:{shop.outcome_pause(n)}") for n in waits)


def returned(order_id: str) -> tuple[int, dict[str, Any]]:
    """The return page: a hint that the customer authenticated; the task reads Stripe."""

    def by_return_page(pause_id: str) -> bool:
        try:
            answer_pause(shop.app, pause_id, {"source": "return-page"})
        except NotPausedError:
            return False
        return True

    return 200, {"order_id": order_id, "answered": answer_checkout(order_id, by_return_page)}


def _capture_if_retried(order_id: str, event: WebhookEvent) -> list[str]:
    """Stripe holds the amount of a PaymentIntent: if the order's checkout gave up on it
    (``shop.gave_up``), the customer confirmed it again; its capture is published, one
    execution per event (the task decides again, fenced)."""
    payment_id = event.object_id
    if not payment_id:
        return []
    with shop.agboss.store.engine.connect() as conn:
        if not shop.gave_up(conn, order_id, payment_id):
            return []
    capture = shop.capture_retried_checkout
    task_id = f"retried-{event.event_id}"
    return [capture.apply_async((order_id, payment_id), task_id=task_id).id]


def stripe_webhook(raw: bytes, signature: str | None) -> tuple[int, dict[str, Any]]:
    try:
        events = verify_stripe(raw, signature, config.stripe_webhook_secret())
    except (WebhookSignatureError, WebhookPayloadError) as refused:
        return 400, {"error": str(refused)}
    published = []
    for event in events if isinstance(events, list) else [events]:
        reference = ((event.payload.get("data") or {}).get("object") or {}).get("metadata", {})
        order_id = reference.get("reference") if isinstance(reference, dict) else None
        if event.type in OUTCOMES and order_id:
            answer_checkout(order_id, partial(answer_pause_with_event, shop.app, event=event))
        if event.type == AUTHENTICATED and order_id:
            # Even when a wait took it: an early answer to a wait the checkout, giving up,
            # never reaches. Read after answering, so a give-up noted since is seen.
            published.extend(_capture_if_retried(order_id, event))
        published.append(shop.handle_stripe_event.delay(event.to_message()).id)
    return 200, {"published": published}


def application(environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
    method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
    length = int(environ.get("CONTENT_LENGTH") or 0)
    raw = environ["wsgi.input"].read(length) if length else b""
    if method == "GET" and path == "/health":
        return _reply(start, 200, {"ok": True})
    if method == "POST" and path == "/orders":
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _reply(start, 400, {"error": "the body must be JSON"})
        return _reply(start, *place_order(body if isinstance(body, dict) else {}))
    if method == "GET" and path == "/return":
        order = parse_qs(environ.get("QUERY_STRING", "")).get("order", [""])[0]
        if not order:
            return _reply(start, 400, {"error": "give ?order=<id>"})
        return _reply(start, *returned(order))
    if method == "POST" and path == "/webhooks/stripe":
        header = "HTTP_" + STRIPE_SIGNATURE_HEADER.upper().replace("-", "_")
        return _reply(start, *stripe_webhook(raw, environ.get(header)))
    return _reply(start, 404, {"error": f"no {method} {path}"})


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"web: {format % args}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the shop's HTTP entry point")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    server = make_server(args.host, args.port, application, _ThreadingServer, _QuietHandler)
    print(f"shop listening on http://{args.host}:{server.server_port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
