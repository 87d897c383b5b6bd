"""The checkout, and an order's state as JSON."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from shop.models import Order
from shop.tasks import charge_order

MAX_AMOUNT = 1_000_000


@csrf_exempt  # a JSON endpoint for curl: it reads no session or cookie a forged form could use
@require_POST
def checkout(request: HttpRequest) -> JsonResponse:
    """``POST amount=<cents>``: the order, and its charge published with it.

    Inside ``transaction.atomic()`` the ``.delay()`` is recorded in the request's
    transaction and sent when it commits (docs/django.md): a request rolled back after
    it charges nobody, and the task never looks for an order not committed yet.
    """
    try:
        amount = int(request.POST.get("amount", ""))
    except ValueError:
        amount = 0
    if not 0 < amount <= MAX_AMOUNT:
        return JsonResponse({"error": f"give amount, in cents, 1 to {MAX_AMOUNT}"}, status=400)
    with transaction.atomic():
        order = Order.objects.create(amount=amount)
        result = charge_order.delay(order.pk)  # sent when the block commits
        order.charge_task_id = result.id  # the id is fixed already
        order.save(update_fields=["charge_task_id"])
    return JsonResponse(_state(order), status=202)


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
