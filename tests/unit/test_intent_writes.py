"""Every write to an intent goes through ``celery_agboss.core.transitions``.

A status change there is a guarded compare-and-set with its history row, made in one
function; a write that called the store's ``update_intent`` or ``insert_intent`` from
elsewhere could change an intent without the row, or guard it differently. This test
reads the package's source: the only callers are in ``core/transitions.py``, besides the
store itself and its contract scenarios (``testing/contract``), which exercise the verbs.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "celery_agboss"
HOME = PACKAGE / "core" / "transitions.py"
EXERCISERS = (("store",), ("testing", "contract"))
"""The store, which implements the writes, and the scenarios that test it."""
WRITES = frozenset({"update_intent", "insert_intent", "append_history", "append_history_after"})
"""The store transaction's intent writes (``core.store_protocol.StoreTransaction``)."""


def _calls_of_writes(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITES
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "self")
        ):
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.func.attr}")
    return found


def _exercises(path: Path) -> bool:
    parts = path.relative_to(PACKAGE).parts
    return any(parts[: len(prefix)] == prefix for prefix in EXERCISERS)


def test_intent_writes_are_made_in_transitions_only() -> None:
    outside = [
        call
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != HOME and not _exercises(path)
        for call in _calls_of_writes(path)
    ]
    assert outside == [], "intent writes outside core/transitions.py: " + ", ".join(outside)


def test_the_check_sees_a_write_made_elsewhere(tmp_path: Path) -> None:
    """Its twin: a call written outside the home is found."""
    stray = tmp_path / "stray.py"
    stray.write_text("def f(tx):\n    tx.update_intent('k', None, None)\n", encoding="utf-8")
    assert _calls_of_writes(stray, tmp_path) == ["stray.py:2 update_intent"]
    assert _calls_of_writes(HOME), "the home itself makes the writes"
