"""The PayPal dialect's Payments v2: an authorization's captures and void, a capture's
refunds, and the bodies PayPal answers for each (the orders' bodies reuse them).

PayPal is named only to identify its public API. An authorization is captured once or
in parts, as PayPal allows: a capture with ``final_capture: true`` closes it (a later
capture gets 422 ``AUTHORIZATION_ALREADY_CAPTURED``), one without (PayPal's default is
false) leaves the rest capturable, and one past what is left is refused with 422
``MAX_CAPTURE_AMOUNT_EXCEEDED``. Each capture has its own id and amount, and is refunded
on its own (up to its amount). A repeat under a capture's key answers the capture that
key made, as it is now.

A test makes a capture or refund answer another status (``PayPalDialect.status_next``).
One that says no money moved (a capture DECLINED or FAILED, a refund FAILED or
CANCELLED) is a 201 all the same: the declined action goes through the gateway's request
path (``checkout_actions.ActionDeclines``, recorded ``DECLINED``, kept under the key and
replayed to a repeat) and is in no capture, refund or balance. A PENDING one moves the
money as a COMPLETED one does, and shows PENDING.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from celery_agboss.testing.dialects.checkout_actions import ActionDeclines
from celery_agboss.testing.dialects.paypal_wire import (
    KIND_ERRORS,
    NOTHING_PROCESSED,
    from_value,
    iso,
    not_found,
    paypal_error,
    to_value,
    value_issue,
)
from celery_agboss.testing.gateway_server import FakeGatewayServer, GatewayCall, Reply, Sends
from celery_agboss.testing.gateway_types import (
    FakeGatewayError,
    FakeGatewayErrorKind,
    FakeGatewayTimeout,
    MoneyRequest,
)

Body = dict[str, Any]
_Act = Callable[[Body, int | None, str | None], Reply]  # payment, amount, key -> reply
_CLOSED = dict.fromkeys(("succeeded", "refunded"), "AUTHORIZATION_ALREADY_CAPTURED")
"""An authorization closed by a final capture (or one that took all of it)."""
SHOWN = {"capture": ("DECLINED", "FAILED", "PENDING"), "refund": ("FAILED", "CANCELLED", "PENDING")}
"""The statuses ``status_next`` answers, besides COMPLETED (PayPal's Payments v2 enums)."""


def gateway_error(exc: FakeGatewayError, invalid_issue: str) -> Reply:
    """A fake gateway failure as PayPal answers it: a dropped answer, or its error body."""
    if isinstance(exc, FakeGatewayTimeout):
        return Reply(0, drop=True)
    if exc.kind is FakeGatewayErrorKind.INVALID_REQUEST:
        return paypal_error(422, invalid_issue, str(exc))
    status, issue, description = KIND_ERRORS.get(exc.kind, NOTHING_PROCESSED)
    return paypal_error(status, issue, description)


class PayPalPayments:
    """Payments v2 endpoints and bodies over the server's ``FakeGateway``."""

    def __init__(self, server: FakeGatewayServer) -> None:
        self.server = server
        self._lock = threading.Lock()
        self._armed: dict[str, list[str]] = {"capture": [], "refund": []}
        self._shown: dict[str, str] = {}  # a capture's or refund's id -> the status it shows
        self._up_of: dict[str, str] = {}  # a declined action's id -> what it was made of
        self._declines = ActionDeclines()

    def status_next(self, operation: str, status: str, times: int) -> None:
        """The next ``times`` captures of an authorization or refunds (``operation``)
        answered ``status`` (see the module docstring)."""
        if status not in SHOWN.get(operation, ()):
            raise ValueError(f"{operation!r} cannot be answered {status!r}: see {SHOWN}")
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._armed[operation] += [status] * times

    def _take(self, operation: str) -> str | None:
        with self._lock:
            armed = self._armed[operation]
            return armed.pop(0) if armed else None

    def _act(
        self,
        operation: str,
        act: Callable[[], Body],
        payment_id: str,
        amount: int | None,
        key: str | None,
        up: str,
    ) -> tuple[Body, str | None]:
        """``act()`` (the gateway's own capture or refund: a repeat under ``key`` replays a
        declined one too), or the declined action when a status that moves no money is
        armed (``up``: what its ``up`` link names). Returns what the gateway answered and
        the status to show on what ``act()`` made (PENDING), if any."""
        shown = self._take(operation)
        if shown is None or shown == "PENDING":
            return act(), shown
        gateway = self.server.gateway
        try:
            done = self._declines.perform(gateway, operation, payment_id, key, amount, None)
        except FakeGatewayTimeout:  # made, its answer dropped: a repeat replays it as made
            made = [r.object_id for r in gateway.requests_for(key)] if key else []
            self._show_declined(made[-1] if made else None, shown, up)
            raise
        self._show_declined(done["id"], shown, up)
        return done, None

    def _show_declined(self, object_id: str | None, status: str, up: str) -> None:
        """A declined action just made shows ``status`` (a repeat of a capture or refund
        made before, or a request never processed, made none)."""
        if object_id is not None and self._declines.made(object_id) is not None:
            self._show(object_id, status, up)

    def _show(self, object_id: str, status: str, up: str | None = None) -> None:
        """``object_id`` (a capture, a refund) shows ``status`` from now on."""
        with self._lock:
            self._shown.setdefault(object_id, status)
            if up is not None:
                self._up_of.setdefault(object_id, up)

    def _declined_body(self, receipt: Body) -> Body | None:
        """The body of a declined capture or refund (None when ``receipt`` is not one)."""
        declined = self._declines.made(receipt["id"])
        if declined is None:
            return None
        kind = "captures" if declined["object"] == "capture" else "refunds"
        with self._lock:
            status = self._shown[declined["id"]]
            up = self._up_of[declined["id"]]
        body = self.resource(f"payments/{kind}", declined["id"], status, declined["created"])
        body["amount"] = self.money(declined["amount"], declined["currency"])
        up_kind = "authorizations" if kind == "captures" else "captures"
        return self._up(body, f"payments/{up_kind}", up)

    def sent(self, operation: str) -> Sends:
        """What a Payments v2 request of ``operation`` (``capture`` or ``void`` of an
        authorization, ``refund`` of a capture) is, for one the server records itself."""

        def read(call: GatewayCall) -> MoneyRequest:
            key, named = call.header("PayPal-Request-Id"), call.params.get("id", "")
            if operation == "refund":
                found = self._capture(named)
                payment = None if found is None else found[0]
            else:
                payment = self.payment(named)
            money = call.body.get("amount")
            amount = None
            if payment is not None and isinstance(money, dict) and operation != "void":
                amount = from_value(money.get("value"), payment["currency"])
            return MoneyRequest(operation, key, amount, named if payment is None else payment["id"])

        return read

    # --- endpoints ------------------------------------------------------------------------

    def get_authorization(self, call: GatewayCall) -> Reply:
        found = self.payment(call.params["id"])
        return not_found() if found is None else Reply(200, self.authorization(found))

    def get_capture(self, call: GatewayCall) -> Reply:
        found = self._capture(call.params["id"])
        if found is None:
            declined = self._declined_body({"id": call.params["id"]})
            return not_found() if declined is None else Reply(200, declined)
        return Reply(200, self.capture_body(*found))

    def capture_authorization(self, call: GatewayCall) -> Reply:
        """Capture all that is left (no ``amount``) or a part; ``final_capture`` closes it."""
        final = call.body.get("final_capture") is True

        def capture(payment: Body, amount: int | None, key: str | None) -> Reply:
            gateway = self.server.gateway
            act = partial(gateway.capture, payment["id"], key, amount=amount, final=final)
            done, shown = self._act("capture", act, payment["id"], amount, key, payment["id"])
            declined = self._declined_body(done)
            if declined is not None:
                return Reply(201, declined)
            made = self._made_by(done["id"], key)
            if shown is not None:
                self._show(made["id"], shown)
            return Reply(201, self.capture_body(done, made))

        issues = {**_CLOSED, "canceled": "AUTHORIZATION_VOIDED"}
        auth_id = call.params["id"]
        return self._payment_call(call, auth_id, capture, issues, "MAX_CAPTURE_AMOUNT_EXCEEDED")

    def void(self, call: GatewayCall) -> Reply:
        def void(payment: Body, amount: int | None, key: str | None) -> Reply:
            done = self.server.gateway.void(payment["id"], key)
            minimal = "return=representation" not in (call.header("Prefer") or "")
            return Reply(204) if minimal else Reply(200, self.authorization(done))

        issues = {**_CLOSED, "canceled": "PREVIOUSLY_VOIDED"}
        return self._payment_call(call, call.params["id"], void, issues, "CANNOT_BE_VOIDED")

    def refund(self, call: GatewayCall) -> Reply:
        """Refund a capture: an order's (the payment itself) or one of an authorization's."""
        found = self._capture(call.params["id"])
        if found is None:
            return not_found()
        payment, part = found
        capture_id = None if part is None else part["id"]
        if part is None:
            left = payment["amount_captured"] - payment["amount_refunded"]
        else:
            left = part["amount"] - part["amount_refunded"]

        def refund(payment: Body, amount: int | None, key: str | None) -> Reply:
            gateway = self.server.gateway
            act = partial(gateway.refund, payment["id"], key, amount=amount, capture_id=capture_id)
            up = call.params["id"]
            done, shown = self._act("refund", act, payment["id"], amount, key, up)
            declined = self._declined_body(done)
            if declined is not None:
                return Reply(201, declined)
            if shown is not None:
                self._show(done["id"], shown)
            return Reply(201, self.refund_body(done))

        issues = {payment["status"]: "CAPTURE_FULLY_REFUNDED"} if left <= 0 else {}
        return self._payment_call(call, payment["id"], refund, issues, "REFUND_AMOUNT_EXCEEDED")

    def _payment_call(
        self, call: GatewayCall, payment_id: str, act: _Act, issues: dict[str, str], issue: str
    ) -> Reply:
        """One Payments v2 call on the fake's payment: its amount read, its refusals named
        (by the payment's status before the call, else ``issue``)."""
        payment = self.payment(payment_id)
        if payment is None:
            return not_found()
        money, amount = call.body.get("amount"), None
        if isinstance(money, dict):
            value = money.get("value")
            amount = from_value(value, payment["currency"])
            if amount is None:
                refused = value_issue(value, payment["currency"]) or "INVALID_PARAMETER_VALUE"
                return paypal_error(422, refused, "amount is not valid.")
        try:
            return act(payment, amount, call.header("PayPal-Request-Id"))
        except FakeGatewayError as exc:
            return gateway_error(exc, issues.get(payment["status"], issue))

    # --- what the fake keeps ------------------------------------------------------------------

    def payment(self, payment_id: str) -> Body | None:
        try:
            return self.server.gateway.retrieve(payment_id)
        except FakeGatewayError:
            return None

    def _parts(self, payment_id: str) -> list[Body]:
        """An authorization's captures, oldest first."""
        return [c for c in self.server.gateway.captures if c["payment"] == payment_id]

    def _made_by(self, payment_id: str, key: str | None) -> Body:
        """The capture this request's key made (a repeat: the key's first), else the newest."""
        parts = self._parts(payment_id)
        keyed = [c for c in parts if key is not None and c["idempotency_key"] == key]
        return (keyed or parts)[-1]

    def _capture(self, capture_id: str) -> tuple[Body, Body | None] | None:
        """A capture by its id and its payment: one of an authorization's captures, or an
        order's capture (the fake's payment itself, captured at once); None if neither."""
        part = next((c for c in self.server.gateway.captures if c["id"] == capture_id), None)
        if part is not None:
            payment = self.payment(part["payment"])
            return None if payment is None else (payment, part)
        payment = self.payment(capture_id)
        if payment is None or payment["amount_captured"] == 0 or self._parts(capture_id):
            return None
        return payment, None

    # --- bodies -------------------------------------------------------------------------------

    def money(self, amount: int, currency: str) -> dict[str, str]:
        return {"currency_code": currency.upper(), "value": to_value(amount, currency)}

    def resource(self, kind: str, object_id: str, status: str, created: float) -> Body:
        href = f"{self.server.url}/v2/{kind}/{object_id}"
        return {
            "id": object_id,
            "status": status,
            "create_time": iso(created),
            "update_time": iso(created),
            "links": [{"href": href, "rel": "self", "method": "GET"}],
        }

    def _up(self, body: Body, kind: str, object_id: str) -> Body:
        """PayPal's ``up`` link: what a capture or refund was made of (an authorization, a
        capture), the way its answer names its payment."""
        href = f"{self.server.url}/v2/{kind}/{object_id}"
        body["links"].append({"href": href, "rel": "up", "method": "GET"})
        return body

    def capture_body(self, payment: Body, part: Body | None) -> Body:
        """A capture: one of an authorization's (``part``), or an order's (the payment)."""
        source = payment if part is None else part
        amount = payment["amount_captured"] if part is None else part["amount"]
        refunded = source["amount_refunded"]
        capture_id = payment["id"] if part is None else part["id"]
        with self._lock:
            status = self._shown.get(capture_id, "COMPLETED")
        status = status if refunded == 0 else "PARTIALLY_REFUNDED"
        status = "REFUNDED" if refunded >= amount else status
        body = self.resource("payments/captures", capture_id, status, source["created"])
        if part is not None:
            self._up(body, "payments/authorizations", payment["id"])
        body.update(
            amount=self.money(amount, payment["currency"]),
            final_capture=True if part is None else part["final"],
            custom_id=payment["reference"],
        )
        return body

    def captures_of(self, payment: Body) -> list[Body]:
        """A payment's captures as PayPal lists them in its order."""
        parts = self._parts(payment["id"])
        if parts:
            return [self.capture_body(payment, part) for part in parts]
        return [self.capture_body(payment, None)] if payment["amount_captured"] > 0 else []

    def authorization(self, payment: Body) -> Body:
        status = {"requires_capture": "CREATED", "canceled": "VOIDED"}.get(payment["status"])
        if status == "CREATED" and payment["amount_captured"] > 0:
            status = "PARTIALLY_CAPTURED"  # captured in part, the rest still capturable
        if status is None:
            whole = payment["amount_captured"] >= payment["amount"]
            status = "CAPTURED" if whole else "PARTIALLY_CAPTURED"
        created = payment["created"]
        body = self.resource("payments/authorizations", payment["id"], status, created)
        body.update(
            amount=self.money(payment["amount"], payment["currency"]),
            custom_id=payment["reference"],
            expiration_time=iso(created + 29 * 86400),
        )
        return body

    def refund_body(self, refund: Body) -> Body:
        with self._lock:
            status = self._shown.get(refund["id"], "COMPLETED")
        body = self.resource("payments/refunds", refund["id"], status, refund["created"])
        body["amount"] = self.money(refund["amount"], refund["currency"])
        return self._up(body, "payments/captures", refund.get("capture") or refund["payment"])


__all__ = ["PayPalPayments", "gateway_error"]
