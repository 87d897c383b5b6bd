"""What one sweep run did (design: sweep): the task's result, its ``sweep.finished`` line
and the metrics' counts (``agboss_sweep_rows_total`` has one action per count)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SweepReport:
    """What one run did; its ``as_dict()`` is the task's result (Flower shows it)."""

    tick: int | None = None
    skipped: str | None = None
    republished: int = 0
    links_republished: int = 0  # completed, links never sent (``sweep.links``)
    parked: int = 0
    expired: int = 0
    cancelled: int = 0
    reconciled: int = 0
    not_sent_confirmed: int = 0  # NotSent a lookup that proves absence answered
    not_sent_unproven: int = 0  # NotSent of a lookup that cannot prove it: may be paid
    unreconciled: int = 0
    lookup_failed: int = 0
    unknown_calls: int = 0  # intents of a call this process cannot name (also in errors)
    lookups_deferred: int = 0  # stranded intents left to the next run: the time budget ran out
    intents_deleted: int = 0
    effects_deleted: int = 0
    executions_deleted: int = 0
    outbox_published: int = 0
    outbox_deleted: int = 0
    errors: int = 0
    duration_ms: int = 0
    republished_ids: list[str] = field(default_factory=list, repr=False)

    @property
    def ran(self) -> bool:
        return self.skipped is None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("republished_ids")
        return data

    def summary(self) -> dict[str, Any]:
        """The task's result, short enough to read in Flower: the main counts always,
        the others when not zero."""
        if not self.ran:
            return {"skipped": self.skipped}
        data = self.as_dict()
        main = (
            "republished",
            "reconciled",
            "unreconciled",
            "parked",
            "expired",
            "cancelled",
            "errors",
        )
        short = {name: data[name] for name in main}
        short.update(
            {
                k: v
                for k, v in data.items()
                if v and k not in short and k not in ("skipped", "duration_ms")
            }
        )
        short["duration_ms"] = self.duration_ms
        return short


__all__ = ["SweepReport"]
