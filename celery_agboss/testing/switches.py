"""Switch a protection off for one block, to prove the test guarding it can fail.

A guarantee test passes just as well when the protection behind it is missing,
unless a twin removes the protection and shows the harm (two payments in
``FakeGateway.payments``). These switches refuse to work outside a test run —
``SabotageRefusedError`` unless ``AGBOSS_ALLOW_SABOTAGE=1`` is set under pytest —
and are never settings, so production cannot be talked into a double charge.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from celery_agboss.core import sabotage as _core
from celery_agboss.core.sabotage import ENV_SWITCH, active
from celery_agboss.errors import SabotageRefusedError


def names() -> list[str]:
    """Every protection that can be switched off, sorted (``celery_agboss.core.protections``)."""
    return sorted(_core.known())


def allowed() -> bool:
    """Whether this process may switch protections off (a test run that opted in)."""
    return _core._allowed()


class Sabotage:
    """``sabotage(*protections)``: a ``with`` block without them; refused outside tests.

    An object, so that ``sabotage.names()`` and ``sabotage.allowed()`` travel with the
    one name tests import (``celery_agboss.testing.sabotage``); this module is named
    ``switches`` so that name never hides it.
    """

    def __call__(self, *protections: str) -> AbstractContextManager[None]:
        return _core.switched_off(*protections)

    @staticmethod
    def names() -> list[str]:
        return names()

    @staticmethod
    def allowed() -> bool:
        return allowed()


sabotage = Sabotage()


__all__ = [
    "ENV_SWITCH",
    "SabotageRefusedError",
    "active",
    "allowed",
    "names",
    "sabotage",
]
