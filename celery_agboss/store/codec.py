"""One canonical JSON encoding for everything the store keeps as text."""

from __future__ import annotations

import json
from typing import Any

from celery_agboss.core.store_protocol import JSON


def dumps(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, UTF-8 kept, no NaN (refused, not stored)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def loads(text: str | None) -> JSON:
    if text is None:
        return None
    value: JSON = json.loads(text)
    return value
