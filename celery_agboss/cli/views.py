"""How the ``celery -A proj agboss`` commands show records: text for people, dicts for
``--json``. Times are ISO 8601 in UTC; requests and results appear as stored (masked).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from celery_agboss.core.executions import ExecutionRecord, ExecutionState
from celery_agboss.core.history import HistoryVerdict
from celery_agboss.core.lookup import not_sent_proven
from celery_agboss.core.outbound import declared_call
from celery_agboss.core.pauses import PauseRecord
from celery_agboss.core.store_protocol import HistoryRow, IntentRecord, IntentStatus, LeaseState
from celery_agboss.store.schema import intent_history, outbound_calls
from celery_agboss.store.schema_executions import executions
from celery_agboss.store.unopened import UNOPENED_START, state_known, unopened_fields

if TYPE_CHECKING:
    from celery_agboss.operator import Description
    from celery_agboss.sweep import SweepReport


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")


def age(now_ms: int, then_ms: int | None) -> str:
    if then_ms is None:
        return "-"
    seconds = max(0, (now_ms - then_ms) // 1000)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [list(headers), *rows]
    )


# --- views: what a record looks like to people and to machines -----------------------


def intent_view(intent: IntentRecord, *, full: bool = False) -> dict[str, Any]:
    view: dict[str, Any] = {
        "idempotency_key": intent.idempotency_key,
        "execution_id": intent.execution_id,
        "name": intent.name,
        "status": intent.status.value,
        "attempt": intent.attempt,
        "owner": None
        if intent.owner is None
        else {
            "holder": intent.owner.holder,
            "token": intent.owner.token,
            "live": intent.owner_live,
        },
        "needs_operator": intent.needs_operator,
        "operator_reason": intent.operator_reason,
        # "confirmed" only when proven: a script reads it as "nothing was charged", as
        # the sweep's count of that name does; the mark itself is ``not_sent_recorded``.
        "not_sent_confirmed": _proven(intent) is True,
        "not_sent_recorded": intent.not_sent_confirmed,
        "not_sent_proven": _proven(intent),
        "result_stored": intent.result_stored,
        "gateway_transaction_id": intent.gateway_transaction_id,
        "first_attempt_at": iso(intent.first_attempt_at_ms),
        "attempt_started_at": iso(intent.attempt_started_at_ms),
        "completed_at": iso(intent.completed_at_ms),
        "next_lookup_at": iso(intent.next_lookup_at_ms),
        "lookup_failures": intent.lookup_failures,
        "age_seconds": None
        if intent.first_attempt_at_ms is None
        else (intent.read_at_ms - intent.first_attempt_at_ms) // 1000,
    }
    if full:
        view["request"] = intent.request  # as stored: masked by the call's policy
        view["result"] = intent.result
    return _with_unopened(view, unopened_fields(intent, outbound_calls.name))


def _with_unopened(view: dict[str, Any], unopened: dict[str, str]) -> dict[str, Any]:
    """A listed record's values no key of this process opened, by field (only then)."""
    if unopened:
        view["unopened"] = unopened
    return view


def unopened_note(record: ExecutionRecord | IntentRecord) -> str:
    """``args, kwargs: [sealed under key …]`` for a record a listing could not open
    whole; empty otherwise."""
    table = executions.name if isinstance(record, ExecutionRecord) else outbound_calls.name
    unopened = unopened_fields(record, table)
    if not unopened:
        return ""
    return f"{', '.join(unopened)}: {next(iter(unopened.values()))}"


def execution_view(record: ExecutionRecord) -> dict[str, Any]:
    view = {
        "id": record.id,
        "task_name": record.task_name,
        "state": record.state.value,
        "reason": record.reason,
        "cancel_requested": record.cancel_requested,
        "cancel_reason": record.cancel_reason,
        "recovery_count": record.recovery_count,
        "deliveries": record.deliveries,
        "wake_requested": record.wake_requested,
        "requested_at": iso(record.requested_at_ms),
        "started_at": iso(record.started_at_ms),
        "not_before": iso(record.not_before_ms),
        "eta": iso(record.eta_ms),
        "expires": iso(record.expires_ms),
        "terminal_at": iso(record.terminal_at_ms),
    }
    return _with_unopened(view, unopened_fields(record, executions.name))


def lease_view(lease: LeaseState | None) -> dict[str, Any] | None:
    if lease is None:
        return None
    return {
        "holder": lease.holder,
        "token": lease.token,
        "live": lease.live,
        "released": lease.released,
        "expires_at": iso(lease.expires_at_ms),
    }


def history_view(row: HistoryRow) -> dict[str, Any]:
    view = {
        "seq": row.seq,
        "at": iso(row.at_ms),
        "event": row.event,
        "from": row.from_status,
        "to": row.to_status,
        "attempt": row.attempt,
        "holder": row.holder,
        "token": row.token,
        "detail": row.detail,
    }
    return _with_unopened(view, unopened_fields(row, intent_history.name))


def _json_value(text: str | None) -> Any:
    """A stored JSON text as its value; one that did not open here as its text."""
    if text is None:
        return None
    return text if text.startswith(UNOPENED_START) else json.loads(text)


def pause_view(pause: PauseRecord) -> dict[str, Any]:
    """A pause for ``--json``: what it asks and its answer as JSON values."""
    return {
        "pause_id": pause.pause_id,
        "name": pause.name,
        "status": pause.status,
        "payload": _json_value(pause.payload),
        "answer": _json_value(pause.answer),
        "created_at": iso(pause.created_at_ms),
        "answered_at": iso(pause.answered_at_ms),
    }


def pause_lines(pause: PauseRecord) -> list[str]:
    lines = [f"  {pause.pause_id}  {pause.status} since {iso(pause.created_at_ms)}"]
    if pause.payload is not None:
        lines.append(f"    asks: {pause.payload}")
    if pause.answer is not None:
        lines.append(f"    answer: {pause.answer}")
    if pause.status == "PENDING":
        lines.append(f"    answer it: celery -A proj agboss answer-pause {pause.pause_id} ANSWER")
    return lines


RESOLVE_HINT = (
    "\nLook one up at the gateway, then settle it:\n"
    "  celery -A proj agboss show KEY\n"
    "  celery -A proj agboss resolve KEY --completed RESULT_JSON --reason TEXT\n"
    "  celery -A proj agboss resolve KEY --not-sent --reason TEXT"
)


def waits_for_operator(intent: IntentRecord) -> bool:
    if intent.status is IntentStatus.COMPLETED:
        return not intent.result_stored
    return intent.needs_operator


NOT_SENT_TEXT = {
    True: "NOT SENT (confirmed; resent by its next delivery)",
    False: (
        "NOT FOUND by its lookup (cannot be proven for this gateway: it may be paid); its "
        "next delivery resends under the same key, which the gateway replays if it was "
        "processed"
    ),
    None: (
        "NOT FOUND by its lookup (whether that proves it unsent depends on its "
        "OutboundCall, not declared in this process: it may be paid); its next delivery "
        "resends under the same key, which the gateway replays if it was processed"
    ),
}
"""What a recorded ``NotSent`` is said to be, by ``not_sent_proven`` of its call."""


def _proven(intent: IntentRecord) -> bool | None:
    """Whether the ``NotSent`` recorded on a pending intent is proven, decided as the
    sweep decides it, by the call this process declares under its name; None when none
    is recorded (or the intent is settled) or the call is not declared here."""
    if not intent.not_sent_confirmed or intent.status is not IntentStatus.PENDING:
        return None
    return not_sent_proven(declared_call(intent.name))


def intent_state(intent: IntentRecord) -> str:
    if intent.status is IntentStatus.COMPLETED and not intent.result_stored:
        return "NEEDS OPERATOR: result not stored"
    if intent.needs_operator:
        return f"NEEDS OPERATOR: {intent.operator_reason or 'unreconciled'}"
    if intent.owner_live:
        return "IN FLIGHT (owner live)"
    if intent.not_sent_confirmed:
        return NOT_SENT_TEXT[_proven(intent)]
    return "PENDING (the sweep looks it up)"


def status_text(intent: IntentRecord) -> str:
    """The intent's status, and for a pending one what it waits for, each said once
    (``PENDING (the sweep looks it up)``, ``PENDING — NEEDS OPERATOR: …``)."""
    status = intent.status.value
    if intent.status is not IntentStatus.PENDING:
        return status
    detail = intent_state(intent)
    return detail if detail.startswith(status) else f"{status} — {detail}"


def chain_text(verdict: HistoryVerdict) -> str:
    """Whether an intent's history chain verified, said the same way everywhere; a
    verdict that names no broken row is one ``describe`` could not check whole."""
    if verdict.ok:
        return "chain verified"
    if verdict.first_broken_seq is None:
        return f"chain not checked whole: {verdict.reason}"
    return f"CHAIN BROKEN at row {verdict.first_broken_seq}: {verdict.reason}"


def state_text(state: ExecutionState) -> str:
    """A state as ``show`` says it; one a newer version wrote, with what to do."""
    if state_known(state):
        return state.value
    return (
        f"{state.value} (a state this version of celery_agboss does not know: a newer "
        "version wrote it; act on it with that version)"
    )


def users_text(intent: IntentRecord, users: Sequence[str]) -> str:
    """The executions an intent may hold up, its creator marked: a shared intent (a
    double click) shows every execution a settle of it sends on."""
    return ", ".join(f"{e} (creator)" if e == intent.execution_id else e for e in users)


def describe_text(found: Description) -> str:
    lines: list[str] = []
    e = found.execution
    if e is not None:
        lines.append(f"Execution {e.id}  ({e.task_name})")
        lines.append(f"  state: {state_text(e.state)}" + (f" — {e.reason}" if e.reason else ""))
        note = unopened_note(e)
        if note:
            lines.append(f"  not opened here: {note}")
        if e.cancel_requested:
            lines.append(f"  cancel requested: {e.cancel_reason or 'yes'}")
        lines.append(f"  recovery count: {e.recovery_count}, deliveries: {e.deliveries}")
        for label, ms in (
            ("requested", e.requested_at_ms),
            ("started", e.started_at_ms),
            ("not before", e.not_before_ms),
            ("eta", e.eta_ms),
            ("expires", e.expires_ms),
            ("terminal", e.terminal_at_ms),
        ):
            if ms is not None:
                lines.append(f"  {label}: {iso(ms)}")
    lease = found.lease
    if lease is not None:
        state = "LIVE" if lease.live else ("released" if lease.released else "expired")
        lines.append(f"  lease: {state}, holder {lease.holder}, token {lease.token}")
    for intent in found.intents:
        marker = " <-" if intent.idempotency_key == found.focus else ""
        lines.append(f"Intent {intent.idempotency_key}{marker}")
        lines.append(f"  call: {intent.name}, attempt {intent.attempt}, {status_text(intent)}")
        users = found.used_by.get(intent.idempotency_key)
        if users:
            lines.append(f"  used by: {users_text(intent, users)}")
        if intent.gateway_transaction_id:
            lines.append(f"  gateway transaction: {intent.gateway_transaction_id}")
        lines.append(f"  request (as stored): {json.dumps(intent.request, sort_keys=True)}")
        if intent.status is IntentStatus.COMPLETED:
            lines.append(f"  result (as stored): {json.dumps(intent.result, sort_keys=True)}")
        chain = found.chains.get(intent.idempotency_key)
        if chain is not None:
            lines.append(f"  history: {chain_text(chain)}")
        for row in found.history.get(intent.idempotency_key, []):
            lines.append(
                f"    {row.seq:>3} {iso(row.at_ms)} {row.event:<22} "
                f"{row.from_status or '-'} -> {row.to_status} (attempt {row.attempt})"
            )
    if found.pauses:
        lines.append("Pauses:")
        for pause in found.pauses:
            lines += pause_lines(pause)
    if found.audit:
        lines.append("Audit:")
        for a in found.audit:
            lines.append(f"  {iso(a.at_ms)} {a.actor} {a.action} {a.target}: {a.reason}")
    return "\n".join(lines)


def report_data(report: SweepReport) -> dict[str, Any]:
    return {**report.as_dict(), "republished_ids": report.republished_ids}


def report_text(report: SweepReport) -> str:
    if not report.ran:
        return f"Sweep skipped: {report.skipped}."
    done = {
        k: v
        for k, v in report.as_dict().items()
        if v and k not in ("tick", "skipped", "duration_ms")
    }
    what = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in done.items()) or "nothing to do"
    return f"Sweep done in {report.duration_ms} ms: {what}."


__all__ = [
    "RESOLVE_HINT",
    "age",
    "chain_text",
    "describe_text",
    "execution_view",
    "history_view",
    "intent_state",
    "intent_view",
    "iso",
    "lease_view",
    "report_data",
    "report_text",
    "status_text",
    "table",
    "unopened_note",
    "waits_for_operator",
]
