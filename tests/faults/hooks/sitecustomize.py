"""Start-up hooks for a fault test's worker processes (never part of a user's deployment).

A fault test that must reach inside a worker (skew its clocks, stop it at a named fault
point) puts this directory first on the deployment's ``PYTHONPATH``; Python imports
``sitecustomize`` at start-up, before Celery, so each hook module below is in place in
the worker's main process and in every pool child it forks. A hook reads its own
``AGBOSS_TEST_*`` variable and does nothing when that is unset. Tests that use this
say so in their docstrings: it is a harness speed-up, like the ``AGBOSS_*`` settings.
"""

from __future__ import annotations

import importlib

HOOK_MODULES = ("agboss_clock_hook", "agboss_fault_hook")

for _name in HOOK_MODULES:
    try:
        importlib.import_module(_name)
    except ModuleNotFoundError as exc:  # a hook not written (yet) is a hook not used
        if exc.name != _name:
            raise
