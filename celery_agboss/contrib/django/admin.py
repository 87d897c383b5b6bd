"""The admin: executions, intents and pauses, read-only, and the operator's decisions.

Lists come from the store's tables through unmanaged models (on the store's alias);
a record's page is the operator API's ``describe`` (the same record ``agboss show``
prints, with each intent's history chain verified). Every decision is a form on one
record's page, posted to the operator API, which refuses what could race a live
delivery and writes the audit row: the admin user is its actor. There is no bulk
action and no add, change or delete; each decision has its own permission
(``agboss.resolve_intent``, ``cancel_execution``, ``unpark_execution``,
``answer_pause``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.views.decorators.http import require_POST

from celery_agboss.cli.views import (
    chain_text,
    execution_view,
    history_view,
    intent_view,
    iso,
    status_text,
    waits_for_operator,
)
from celery_agboss.contrib.django.models import Execution, Intent, Pause
from celery_agboss.contrib.django.project import project_app, store_alias
from celery_agboss.core.executions import TERMINAL_STATES
from celery_agboss.core.store_protocol import IntentRecord, IntentStatus
from celery_agboss.errors import NotPausedError, OperatorRefusedError, StoreError

Decision = Callable[[HttpRequest, str], str]


def admin_actor(request: HttpRequest) -> str:
    """Who the audit trail names for a decision taken here."""
    return f"django-admin:{request.user.get_username()}"


class _ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[misc]  # Django ships no types
    actions = None  # no bulk decisions: one record, one decision, one audit row
    show_full_result_count = False
    list_per_page = 50
    decisions: dict[str, tuple[str, Decision]] = {}  # url name → (permission, decide)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).using(store_alias())

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts
        mine = [
            path(
                f"<path:object_id>/{name}/",
                self.admin_site.admin_view(require_POST(self._decision_view(name))),
                name=f"{opts.app_label}_{opts.model_name}_{name}",
            )
            for name in self.decisions
        ]
        return mine + list(super().get_urls())

    def _decision_view(self, name: str) -> Callable[..., HttpResponse]:
        permission, decide = self.decisions[name]

        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            if not request.user.has_perm(f"{self.opts.app_label}.{permission}"):
                raise PermissionDenied
            key = unquote(object_id)
            try:
                done = decide(request, key)
            except (OperatorRefusedError, NotPausedError) as refused:
                messages.error(request, f"Refused, nothing changed: {refused}")
            except ValueError as bad:
                messages.error(request, f"Nothing changed: {bad}")
            except StoreError as failed:  # a BaseException: Django's handler would let it out
                messages.error(request, f"{_STORE_FAILED} ({failed}): {_LOOK_AGAIN}")
            else:
                messages.success(request, done)
            return HttpResponseRedirect(self._page(key))

        return view

    def _page(self, key: str) -> str:
        opts = self.opts
        return str(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(key)]))

    def allowed(self, request: HttpRequest) -> dict[str, bool]:
        """Which of this page's decision forms the user may post."""
        label = self.opts.app_label
        return {
            name: bool(request.user.has_perm(f"{label}.{permission}"))
            for name, (permission, _) in self.decisions.items()
        }

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        try:
            store_alias()
        except ImproperlyConfigured as why:
            return self._unavailable(request, str(why))
        return super().changelist_view(request, extra_context)

    def _unavailable(
        self, request: HttpRequest, why: str, title: str = "The store is not a Django database"
    ) -> HttpResponse:
        """The page's answer when the store cannot be read through Django: what to do."""
        return self._record_page(request, {"title": title, "key": "", "unavailable": why})

    def _record_page(self, request: HttpRequest, fields: dict[str, Any]) -> HttpResponse:
        context = {**self.admin_site.each_context(request), "opts": self.opts, **fields}
        return TemplateResponse(request, "agboss/admin/record.html", context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        key = unquote(object_id)
        try:
            store_alias()
        except ImproperlyConfigured as why:
            return self._unavailable(request, str(why))
        try:
            record = self.record(key)
        except StoreError as failed:  # a BaseException: Django's handler would let it out
            return self._unavailable(
                request, f"{_STORE_FAILED} ({failed}); look again", title="The store failed"
            )
        title = f"{self.opts.verbose_name.capitalize()} {key}"
        return self._record_page(
            request, {"title": title, "key": key, "allowed": self.allowed(request), **record}
        )

    def record(self, key: str) -> dict[str, Any]:
        """What the record's page shows: the operator API's description of it."""
        from celery_agboss.operator import describe

        try:
            found = describe(project_app(), key)
        except OperatorRefusedError:
            raise Http404(f"no record is named {key!r}") from None
        return {
            "execution": None if found.execution is None else execution_view(found.execution),
            "cancellable": found.execution is not None
            and found.execution.state not in TERMINAL_STATES,
            "execution_url": None
            if found.execution is None
            else reverse("admin:agboss_execution_change", args=[quote(found.execution.id)]),
            "intents": [
                {
                    "fields": _intent_fields(intent),
                    "key": key_,
                    "resolvable": intent.status is IntentStatus.PENDING
                    or waits_for_operator(intent),
                    "url": reverse("admin:agboss_intent_change", args=[quote(key_)]),
                    "request": _as_stored(intent.request),
                    "result": _as_stored(intent.result),
                    "chain": chain_text(found.chains[key_]),
                    "chain_ok": found.chains[key_].ok,
                    "history": [history_view(row) for row in found.history[key_]],
                    "focus": key_ == found.focus,
                }
                for intent in found.intents
                for key_ in [intent.idempotency_key]
            ],
            "audit": [
                {"at": iso(a.at_ms), "actor": a.actor, "action": a.action, "reason": a.reason}
                for a in found.audit
            ],
        }


_STORE_FAILED = "The store failed"
_LOOK_AGAIN = (
    "the decision may or may not be recorded; look at this record's page again (its "
    "audit trail) before deciding again"
)


def _intent_fields(intent: IntentRecord) -> list[tuple[str, Any]]:
    """An intent's fields, its status said as ``agboss show`` says it (``status_text``):
    a ``NotSent`` its call cannot prove shows as "it may be paid", never as a bare
    ``not_sent_confirmed True`` next to the form that resolves it as not sent."""
    view = intent_view(intent)
    view["status"] = status_text(intent)
    for said_by_the_status in ("not_sent_confirmed", "not_sent_recorded", "not_sent_proven"):
        view.pop(said_by_the_status, None)
    return list(view.items())


def _time_column(field: str, label: str) -> Callable[[Any, Any], str | None]:
    """A list column showing a store time (ms) as ISO 8601, sorted by the stored value."""

    def column(admin_: Any, record: Any) -> str | None:
        return iso(getattr(record, field))

    column.short_description = label  # type: ignore[attr-defined]  # Django's column API
    column.admin_order_field = field  # type: ignore[attr-defined]
    return column


def _as_stored(value: Any) -> str:
    """A request or result as the store keeps it: masked by the call's policy."""
    return json.dumps(value, sort_keys=True, indent=2, default=str)


def _reason(request: HttpRequest) -> str:
    reason = str(request.POST.get("reason", "")).strip()
    if not reason:
        raise ValueError("say why (the reason goes into the audit trail)")
    return reason


def _json_field(request: HttpRequest, field: str, what: str) -> Any:
    text = str(request.POST.get(field, "")).strip()
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f'{what} must be JSON (e.g. {{"id": "ch_123"}}), not {text!r}') from None


def _cancel(request: HttpRequest, execution_id: str) -> str:
    from celery_agboss.operator import cancel

    handled = request.POST.get("payments_handled") == "on"
    record = cancel(
        project_app(),
        execution_id,
        _reason(request),
        actor=admin_actor(request),
        payments_handled=handled,
    )
    return f"Execution {execution_id} is {record.state.value}."


def _unpark(request: HttpRequest, execution_id: str) -> str:
    from celery_agboss.operator import unpark

    done = unpark(project_app(), execution_id, _reason(request), actor=admin_actor(request))
    sent = "published again" if done.republished else "left for the sweep to publish"
    return f"Execution {execution_id} unparked: {done.execution.state.value}, {sent}."


def _resolve(request: HttpRequest, key: str) -> str:
    from celery_agboss.operator import resolve

    outcome = request.POST.get("outcome")
    app, who = project_app(), admin_actor(request)
    if outcome == "not_sent":
        done = resolve(app, key, reason=_reason(request), not_sent=True, actor=who)
    elif outcome == "completed":
        result = _json_field(request, "result", "the gateway's result")
        done = resolve(app, key, reason=_reason(request), completed=result, actor=who)
    else:
        raise ValueError("say what the gateway shows: completed (with its result) or not sent")
    return f"Intent {key} resolved: {done.intent.status.value}."


def _answer(request: HttpRequest, pause_id: str) -> str:
    from celery_agboss.operator import answer_pause

    answer = _json_field(request, "answer", "the answer")
    answer_pause(project_app(), pause_id, answer, actor=admin_actor(request))
    return f"Pause {pause_id} answered; its task goes on."


@admin.register(Execution)
class ExecutionAdmin(_ReadOnlyAdmin):
    list_display = ("id", "task_name", "state", "requested", "deliveries", "recovery_count")
    list_filter = ("state",)
    search_fields = ("=id", "task_name")
    ordering = ("-requested_at_ms",)
    decisions = {
        "cancel": ("cancel_execution", _cancel),
        "unpark": ("unpark_execution", _unpark),
    }

    requested = _time_column("requested_at_ms", "requested")


@admin.register(Intent)
class IntentAdmin(_ReadOnlyAdmin):
    list_display = ("idempotency_key", "name", "status", "needs_operator", "first_attempt")
    list_filter = ("status", "needs_operator")
    search_fields = ("=idempotency_key", "=execution_id", "=gateway_transaction_id")
    ordering = ("-first_attempt_at_ms",)
    decisions = {"resolve": ("resolve_intent", _resolve)}

    first_attempt = _time_column("first_attempt_at_ms", "first attempt")


@admin.register(Pause)
class PauseAdmin(_ReadOnlyAdmin):
    list_display = ("id", "name", "status", "created")
    list_filter = ("status",)
    search_fields = ("=id", "=execution_id")
    ordering = ("-created_at_ms",)
    decisions = {"answer": ("answer_pause", _answer)}

    created = _time_column("created_at_ms", "created")

    def record(self, key: str) -> dict[str, Any]:
        """The pause with what it asks, shown above the answer form: whoever answers it
        approves what they see (docs/pauses.md), as ``agboss show`` prints it."""
        from celery_agboss.operator import read_pause

        pause = Pause.objects.using(store_alias()).filter(pk=key).first()
        if pause is None:
            raise Http404(f"no pause is named {key!r}")
        stored = read_pause(project_app(), key)  # the payload, opened when sealed
        return {
            **super().record(pause.execution_id),
            "pause": {
                "id": pause.id,
                "name": pause.name,
                "status": pause.status,
                "created": iso(pause.created_at_ms),
                "answered": iso(pause.answered_at_ms),
            },
            "pause_asks": None if stored is None else _payload_text(stored.payload),
        }


def _payload_text(payload: str | None) -> str | None:
    """A pause's payload as stored (JSON text), indented to be read; as it is when it is
    not JSON. The template escapes it: a payload is the body's data, never markup."""
    if payload is None:
        return None
    try:
        return json.dumps(json.loads(payload), sort_keys=True, indent=2, ensure_ascii=False)
    except ValueError:
        return payload
