"""The HTTP client Checkout.com's official SDK is given by ``CheckoutAdapter``: no retries,
and every request of one send bounded together; and the SDK's answers as plain data.
Checkout.com is named only to identify its public API; this adapter is not affiliated
with or endorsed by it.

A retry by the HTTP stack would be a request the engine never decided (a second POST
under a key whose first answer was lost), and an unbounded wait would outlive the
attempt's lease; so the SDK's ``requests`` session gets an adapter with zero retries
and a timeout on every request, the send's remaining time when ``one_send`` bounds it.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
import types
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from celery_agboss.adapters.common import require_sdk

require_sdk("checkout_sdk", pip_extra="checkout", gateway="Checkout.com")

import requests
from checkout_sdk.checkout_sdk import CheckoutSdk
from checkout_sdk.environment import Environment
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "agboss_checkout_deadline", default=None
)


@contextlib.contextmanager
def one_send(seconds: float) -> Iterator[None]:
    """Bound every request of one send (a POST and the reads of its outcome) together."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


class BoundedHTTPAdapter(HTTPAdapter):
    """Zero retries, and a timeout on every request (``timeout``, or what is left of the
    send's): a retry by the HTTP stack is a request the engine never decided, and an
    unbounded wait outlives the attempt's lease."""

    def __init__(self, timeout: float) -> None:
        super().__init__(max_retries=Retry(total=0, read=False))
        self.timeout = timeout

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float, float] | tuple[float, None] | None = None,
        verify: bool | str = True,
        cert: bytes | str | tuple[bytes | str, bytes | str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        limit, deadline = self.timeout, _deadline.get()
        if deadline is not None:
            limit = min(limit, deadline - time.monotonic())
            if limit <= 0:
                raise requests.exceptions.Timeout(f"the send's {self.timeout:g} s ran out")
        bound = limit if timeout is None else timeout
        return super().send(request, stream, bound, verify, cert, proxies)


def bounded_session(timeout: float) -> requests.Session:
    """The session the SDK sends through: every request bounded, none retried."""
    session = requests.Session()
    for prefix in ("https://", "http://"):
        session.mount(prefix, BoundedHTTPAdapter(timeout))
    return session


def plain(value: Any) -> Any:
    """The SDK's ``ResponseWrapper`` as plain JSON (a list as ``items``), no HTTP metadata."""
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if hasattr(value, "__dict__") and not isinstance(value, (str, int, float)):
        return {k: plain(v) for k, v in vars(value).items() if k != "http_metadata"}
    return value


def as_dict(value: Any) -> dict[str, Any]:
    """An SDK answer as a plain dict (empty when it is not an object)."""
    found = plain(value)
    return found if isinstance(found, dict) else {}


def status_code(exc: BaseException) -> int | None:
    """The HTTP status of an SDK exception, when it carries one."""
    status = getattr(getattr(exc, "http_metadata", None), "status_code", None)
    return status if isinstance(status, int) else None


PENDING = "Pending"
"""A payment awaiting 3-D Secure or an asynchronous method: answered 202, not decided yet."""


def declined(payment: Mapping[str, Any]) -> bool:
    """A 201 or a listed payment that moved no money (Checkout.com declined it). A Pending
    one is not decided yet, whatever its ``approved``: it may still be authorised."""
    if payment.get("status") == PENDING:
        return False
    return payment.get("approved") is False or payment.get("status") == "Declined"


def approved_first(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Actions under one key, those that moved money first: a declined one moved none,
    and a later resend under the key (past its retention) may have been approved."""
    return sorted(actions, key=lambda action: action.get("approved") is False)


def declined_reason(kind: str, payment_id: str, actions: list[dict[str, Any]]) -> str:
    """Why reconcile cannot call a declined action done: no money moved, and reconcile
    has no definite failure to answer, so an operator decides."""
    named = ", ".join(
        f"{a.get('id')} ({a.get('response_code')} {a.get('response_summary')})" for a in actions
    )
    return (
        f"Checkout.com declined the {kind} of {payment_id} made under this key: {named}; "
        "no money moved. Once checked, resolve it --not-sent: a resend under the key gets "
        "the decline replayed inside its retention, and is a new request past it"
    )


def build_sdk(
    secret_key: str, base_url: str | None, subdomain: str | None, sandbox: bool, session: Any
) -> Any:
    """The SDK on ``session``, at ``base_url`` (a test server, a proxy) or at the SDK's
    own sandbox or production hosts for the merchant's ``subdomain``."""
    builder = CheckoutSdk.builder().secret_key(secret_key)
    # The SDK's http_client_builder hook calls get_client() only.
    builder = builder.http_client_builder(types.SimpleNamespace(get_client=lambda: session))
    if base_url is None:
        builder = builder.environment(
            Environment.sandbox() if sandbox else Environment.production()
        )
        if subdomain is not None:  # without one, build() says what to pass
            builder = builder.environment_subdomain(subdomain)
    elif subdomain is not None:
        raise ValueError("pass base_url or subdomain, not both: a base URL names its host")
    else:
        base = base_url.rstrip("/") + "/"
        builder = builder.environment(
            Environment(base, base, base, base, base, base, base, sandbox)
        )
    with warnings.catch_warnings():
        # build() warns of the SDK's own deprecated clients (Risk), whatever is used;
        # use_legacy_domain() (the environment's hosts as given, what an explicit base URL
        # needs) is deprecated for the SDK's shared hosts.
        warnings.simplefilter("ignore", DeprecationWarning)
        if base_url is not None:
            builder = builder.use_legacy_domain()
        return builder.build()


__all__ = [
    "PENDING",
    "BoundedHTTPAdapter",
    "approved_first",
    "as_dict",
    "bounded_session",
    "build_sdk",
    "declined",
    "declined_reason",
    "one_send",
    "plain",
    "status_code",
]
