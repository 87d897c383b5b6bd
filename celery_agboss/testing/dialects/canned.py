"""The replies a test arms with a dialect's ``answer_next``: each answers the next
requests it matches before the gateway sees them, so nothing is processed. The first
armed that matches is used first, each as many times as it was armed for. A money-moving
request answered so still reached the gateway: its route records it ``CANNED``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from celery_agboss.testing.gateway_requests import answered_here
from celery_agboss.testing.gateway_server import Reply
from celery_agboss.testing.gateway_types import GatewayRequestOutcome


@dataclass
class _Armed:
    reply: Reply
    matches: Callable[[str], bool] | None  # None: any request
    remaining: int


class CannedReplies:
    """Armed replies, taken by the requests they match (a path, an operation: the
    dialect's choice of what ``take`` is given)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: list[_Armed] = []

    def arm(self, reply: Reply, matches: Callable[[str], bool] | None, times: int) -> None:
        with self._lock:
            self._armed.append(_Armed(reply, matches, times))

    def take(self, what: str) -> Reply | None:
        """The reply armed for ``what``, used once (and the request it answers marked
        ``CANNED``); None when none is."""
        with self._lock:
            for armed in self._armed:
                if armed.matches is None or armed.matches(what):
                    armed.remaining -= 1
                    if armed.remaining == 0:
                        self._armed.remove(armed)
                    answered_here(GatewayRequestOutcome.CANNED)
                    return armed.reply
        return None

    def clear(self) -> None:
        with self._lock:
            self._armed.clear()


__all__ = ["CannedReplies"]
