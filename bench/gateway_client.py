"""How worker processes reach the benchmark's gateway: plain ``urllib``, one connection
per call, the same for both sides. Imports nothing of celery_agboss, so the plain
worker's memory is a plain Celery worker's."""

from __future__ import annotations

import json
import urllib.request
from typing import Any
from urllib.parse import quote

HTTP_TIMEOUT_SECONDS = 30.0


def _call(url: str, method: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS) as response:
        return json.loads(response.read() or b"null")


def charge_over_http(base_url: str, amount: int, idempotency_key: str, reference: str) -> Any:
    """What a worker sends to charge (both sides of the benchmark)."""
    return _call(
        f"{base_url}/charge",
        "POST",
        {"amount": amount, "idempotency_key": idempotency_key, "reference": reference},
    )


def lookup_over_http(base_url: str, idempotency_key: str) -> Any:
    """The reconcile lookup of the celery_agboss side (never needed when nothing fails)."""
    return _call(f"{base_url}/lookup?key={quote(idempotency_key, safe='')}", "GET")


def payments_over_http(base_url: str) -> int:
    """How many payments the gateway has made (the benchmark's check, not a worker's)."""
    return int(_call(f"{base_url}/payments", "GET")["count"])


__all__ = ["charge_over_http", "lookup_over_http", "payments_over_http"]
