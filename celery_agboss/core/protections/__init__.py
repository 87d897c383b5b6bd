"""Every protection a test may switch off, by name: the one home of the sabotage switches.

The names are kept in three modules by layer (``engine``, ``store``, ``celery_layer``)
and read from here.

A guarantee test proves its protection by switching it off in a twin and counting the
harm (two payments at the fake gateway). The code that holds a protection reads
``sabotage.active(NAME)`` (``celery_agboss.core.sabotage``, which knows no other
names than these); only ``celery_agboss.testing.sabotage`` switches one off, and it
refuses outside a test run. None of these is ever a setting, and none is in a public
``__all__``.
"""

from __future__ import annotations

from celery_agboss.core.protections.celery_layer import *  # noqa: F403
from celery_agboss.core.protections.engine import *  # noqa: F403
from celery_agboss.core.protections.store import *  # noqa: F403

ALL: frozenset[str] = frozenset(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)
)
"""Every switch name of the three modules: what ``sabotage.switched_off`` accepts."""
