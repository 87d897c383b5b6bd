"""What the engine needs to know, frozen: the tenant, the pseudonym key, two durations
and the registry of outbound calls.

The Celery layer builds one ``EngineSettings`` from ``AGBossSettings`` at start-up;
tests build their own. Durations are integer milliseconds, the store's unit, so the
key-age arithmetic done in SQL and here is the same arithmetic.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from celery_agboss.core.keys import pseudonym_key_bytes, validate_tenant
from celery_agboss.core.outbound import OutboundCall, declared_call
from celery_agboss.errors import ConfigurationError

DEFAULT_TENANT = "default"
DEFAULT_LEASE_TTL_MS = 30_000
"""30 s: ``EngineSettings.lease_ttl_ms``'s default, and ``agboss_lease_ttl``'s."""
DEFAULT_ATTEMPT_TIMEOUT_MS = 120_000
"""120 s: ``EngineSettings.attempt_timeout_ms``'s default, and ``agboss_attempt_timeout``'s."""


class OutboundRegistry(Mapping[str, OutboundCall]):
    """Outbound calls by name: the sweep finds a stranded intent's reconcile here.

    A name is one call for the life of the process. A second registration of the same
    name with another object is refused: the sweep could otherwise reconcile one
    gateway's intent with another gateway's lookup.
    """

    def __init__(self, calls: Mapping[str, OutboundCall] | None = None) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, OutboundCall] = {}
        for name, call in (calls or {}).items():
            if name != call.name:
                raise ConfigurationError(
                    f"the outbound call {call.name!r} is registered under another name {name!r}"
                )
            self.register(call)

    def register(self, call: OutboundCall) -> OutboundCall:
        """Add ``call``; the same object again is a no-op, another one of its name is refused."""
        if not isinstance(call, OutboundCall):
            raise ConfigurationError(f"{call!r} is not an OutboundCall")
        with self._lock:
            known = self._calls.get(call.name)
            if known is None:
                self._calls[call.name] = call
            elif known is not call:
                raise ConfigurationError(
                    f"two different OutboundCall objects are named {call.name!r}; names are "
                    "unique per app (the sweep finds a call by its name): declare it once "
                    "at module level and import it",
                    name=call.name,
                )
        return call

    def __getitem__(self, name: str) -> OutboundCall:
        with self._lock:
            return self._calls[name]

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._calls))

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)

    def __repr__(self) -> str:
        return f"OutboundRegistry({sorted(self)})"


@dataclass(frozen=True)
class EngineSettings:
    """The engine's configuration; every worker of one app must agree on all of it."""

    pseudonym_key: bytes = field(repr=False)
    tenant: str = DEFAULT_TENANT
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS
    attempt_timeout_ms: int = DEFAULT_ATTEMPT_TIMEOUT_MS
    registry: Mapping[str, OutboundCall] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.pseudonym_key, bytes):
            raise ConfigurationError(
                "EngineSettings.pseudonym_key must be bytes (the same on every worker)",
                setting="agboss_pseudonym_key",
            )
        pseudonym_key_bytes(self.pseudonym_key)  # refuses a key too short to be a secret
        validate_tenant(self.tenant)
        for name in ("lease_ttl_ms", "attempt_timeout_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigurationError(
                    f"EngineSettings.{name} must be a positive int, not {value!r}"
                )
        if not isinstance(self.registry, OutboundRegistry):
            object.__setattr__(self, "registry", OutboundRegistry(self.registry))

    def register(self, call: OutboundCall) -> OutboundCall:
        """Record ``call`` under its name (refused when another object has that name)."""
        registry = self.registry
        assert isinstance(registry, OutboundRegistry)  # made so in __post_init__
        return registry.register(call)

    def call_named(self, name: str) -> OutboundCall | None:
        """The registered call of that name, else the one call of that name declared in
        this process (then registered), or None: the sweep's way in."""
        found = self.registry.get(name)
        if found is None:
            found = declared_call(name)
            if found is not None:
                self.register(found)
        return found


__all__ = ["EngineSettings", "OutboundRegistry"]
