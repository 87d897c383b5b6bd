"""The checkout, its form, and an order's state as JSON."""

from __future__ import annotations

import secrets

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods

from shop.models import Order
from shop.tasks import charge_order

MAX_AMOUNT = 1_000_000
TOKEN_FIELD = "checkout_token"
MAX_TOKEN_LENGTH = Order._meta.get_field(TOKEN_FIELD).max_length


@csrf_exempt  # a JSON endpoint for curl: it reads no session or cookie a forged form could use
@require_http_methods(["GET", "POST"])
def checkout(request: HttpRequest) -> HttpResponse:
    """``GET``: the checkout form, with a token of its own. ``POST amount=<cents>
    checkout_token=<the form's token>``: the order, and its charge published with it.

    The token makes a submit idempotent: a double click or a proxy's retry posts the same
    form again, finds the order its token placed (200, its state), and publishes nothing;
    only the POST that created the order publishes its charge (202). A client without the
    form sends a token of its own, the same on every retry (its cart id, a UUID). The
    order's unique token is what decides, not a look before the insert: two submits at
    once insert one row (``get_or_create`` takes the other's).

    Inside ``transaction.atomic()`` the ``.delay()`` is recorded in the request's
    transaction and sent when it commits (docs/django.md): a request rolled back after
    it charges nobody, and the task never looks for an order not committed yet.
    """
    if request.method == "GET":
        return render(request, "shop/checkout.html", {"token": secrets.token_urlsafe(24)})
    try:
        amount = int(request.POST.get("amount", ""))
    except ValueError:
        amount = 0
    if not 0 < amount <= MAX_AMOUNT:
        return JsonResponse({"error": f"give amount, in cents, 1 to {MAX_AMOUNT}"}, status=400)
    token = request.POST.get(TOKEN_FIELD, "").strip()
    if not token or len(token) > MAX_TOKEN_LENGTH:
        error = (
            f"give {TOKEN_FIELD}, 1 to {MAX_TOKEN_LENGTH} characters, the same on every "
            "retry of this checkout: the token GET /checkout/ renders into its form, or "
            "your cart's id"
        )
        return JsonResponse({"error": error}, status=400)
    with transaction.atomic():
        order, created = Order.objects.get_or_create(
            checkout_token=token, defaults={"amount": amount}
        )
        if created:
            result = charge_order.delay(order.pk)  # sent when the block commits
            order.charge_task_id = result.id  # the id is fixed already
            order.save(update_fields=["charge_task_id"])
    if not created and order.amount != amount:
        error = f"{TOKEN_FIELD} was used for another order (amount {order.amount}): nothing placed"
        return JsonResponse({"error": error, "order": order.pk}, status=409)
    return JsonResponse(_state(order), status=202 if created else 200)


@require_GET
def order(request: HttpRequest, order_id: int) -> JsonResponse:
    return JsonResponse(_state(get_object_or_404(Order, pk=order_id)))


def _state(order: Order) -> dict[str, object]:
    return {
        "order": order.pk,
        "amount": order.amount,
        "currency": order.currency,
        "status": order.status,
        "payment_id": order.payment_id,
        "times_marked_paid": order.times_marked_paid,
        "charge_task_id": order.charge_task_id,
    }
