"""The core imports neither Celery nor SQLAlchemy (design: core imports nothing): proved with them
blocked.

Each check runs in a fresh interpreter whose import system refuses ``celery``,
``kombu``, ``sqlalchemy`` and ``psycopg``; a second test proves the blocker really
bites, so the first cannot pass by accident.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from tests.support.processes import last_json_line, run_python

MARKER = "blocked by test_core_imports"

_BLOCKER = f"""
import importlib.abc
import sys

BLOCKED = ("celery", "kombu", "sqlalchemy", "psycopg")


def blocked(name):
    root = name.partition(".")[0]
    return root in BLOCKED or root.startswith("psycopg")


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if blocked(name):
            raise ImportError(f"{{name}} {MARKER}", name=name)
        return None


already = sorted(name for name in sys.modules if blocked(name))
sys.meta_path.insert(0, Blocker())
"""

_IMPORT_THE_CORE = """
import importlib
import json
import pkgutil
import traceback

failures = {}
imported = []
try:
    import celery_agboss.core as core
except BaseException:
    failures["celery_agboss.core"] = traceback.format_exc()
else:
    imported.append("celery_agboss.core")

    def on_error(name):
        failures[name] = traceback.format_exc()

    for info in pkgutil.walk_packages(core.__path__, "celery_agboss.core.", onerror=on_error):
        try:
            importlib.import_module(info.name)
        except BaseException:
            failures[info.name] = traceback.format_exc()
        else:
            imported.append(info.name)
leaked = sorted(name for name in sys.modules if blocked(name))
report = {"already": already, "imported": imported, "failures": failures, "leaked": leaked}
print(json.dumps(report))
"""

_PROVE_THE_BLOCKER = """
import importlib
import json

refusals = {}
for name in ("celery", "kombu", "sqlalchemy", "psycopg", "celery_agboss.store"):
    try:
        importlib.import_module(name)
    except ImportError as exc:
        refusals[name] = str(exc)
    else:
        refusals[name] = None
print(json.dumps({"already": already, "refusals": refusals}))
"""


def _run(code: str) -> dict[str, Any]:
    result = last_json_line(run_python("-c", _BLOCKER + code, timeout=60))
    assert result["already"] == [], "a blocked package was imported before the blocker"
    return result


def test_the_core_and_every_module_under_it_import_with_celery_and_sqlalchemy_blocked() -> None:
    result = _run(_IMPORT_THE_CORE)
    assert result["failures"] == {}, "\n".join(result["failures"].values())
    assert result["leaked"] == []
    for module in ("keys", "masking", "history", "canonical", "store_protocol", "outbound"):
        assert f"celery_agboss.core.{module}" in result["imported"]


def test_the_blocker_refuses_celery_kombu_sqlalchemy_and_psycopg() -> None:
    refusals = _run(_PROVE_THE_BLOCKER)["refusals"]
    for name in ("celery", "kombu", "sqlalchemy", "psycopg"):
        assert refusals[name] is not None and MARKER in refusals[name], name


def test_the_blocker_makes_the_sqlalchemy_store_unimportable() -> None:
    if importlib.util.find_spec("celery_agboss.store") is None:
        pytest.skip("celery_agboss.store is not written yet")
    refusals = _run(_PROVE_THE_BLOCKER)["refusals"]
    assert refusals["celery_agboss.store"] is not None
    assert MARKER in refusals["celery_agboss.store"]
