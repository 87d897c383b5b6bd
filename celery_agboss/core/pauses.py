"""A pause as the store keeps it: what it asks, and its answer once given."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PauseRecord:
    """One pause, ``pause_id`` = ``"<execution id>:<name>"``. ``status``: ``PENDING``
    (waits for an answer), ``ANSWERED``, or ``EARLY`` (an answer kept for a pause the
    body has not reached yet). ``payload`` and ``answer`` are the JSON texts
    ``self.pause`` and ``answer_pause`` stored (kombu's JSON, as Celery encodes
    messages), opened when the store is sealed; None when there is none."""

    pause_id: str
    execution_id: str
    name: str
    status: str
    payload: str | None
    answer: str | None
    created_at_ms: int
    answered_at_ms: int | None


__all__ = ["PauseRecord"]
