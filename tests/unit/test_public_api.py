"""docs/api.md is the public surface: every name it lists imports from the module it
names, the root's ``__all__`` is its table, and a module offers each name it lists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

import celery_agboss

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"
MODULE = re.compile(r"`(celery_agboss(?:\.[a-z_]+)*)`")
SPAN = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)")
# An adapter module needs its gateway's SDK (an extra): without it, it cannot be read.
NEEDS_AN_EXTRA = "celery_agboss.adapters."


def _root_table(text: str) -> set[str]:
    section = text.split("\n## `celery_agboss`\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names.update(SPAN.findall(first_cell))
    return names


def _listed() -> dict[str, set[str]]:
    """module -> the names api.md lists for it: each ``Names:`` paragraph belongs to the
    module of the heading or bullet above it; a ``Names, by module`` list names its
    module first in each bullet."""
    listed: dict[str, set[str]] = {}
    current: str | None = None
    collecting: str | None = None
    by_module = False
    for line in API.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        found = MODULE.search(stripped)
        if not stripped:
            collecting = None
        elif line.startswith("## "):
            current, collecting, by_module = (found.group(1) if found else None), None, False
        elif stripped.startswith("- "):
            collecting = None
            if found and found.start() == 2:
                current = found.group(1)
                if by_module:
                    collecting = current
                    listed.setdefault(current, set()).update(SPAN.findall(stripped[found.end() :]))
        elif stripped.startswith("Names, by module"):
            by_module = True
        elif stripped.startswith("Names:"):
            assert current, f"a Names: line with no module above it: {stripped}"
            collecting = current
            listed.setdefault(current, set()).update(SPAN.findall(stripped))
        elif collecting:
            listed[collecting].update(SPAN.findall(stripped))
    return listed


def _module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if name.startswith(NEEDS_AN_EXTRA) and "pip install" in str(exc):
            pytest.skip(f"{name}: {exc}")
        raise


def test_api_md_lists_names_for_each_public_module() -> None:
    listed = _listed()
    assert {
        "celery_agboss.errors",
        "celery_agboss.outbox",
        "celery_agboss.webhooks",
        "celery_agboss.operator",
        "celery_agboss.testing",
        "celery_agboss.metrics",
        "celery_agboss.store",
        "celery_agboss.adapters.stripe",
    } <= set(listed)
    assert all(listed.values())


@pytest.mark.parametrize("module_name", sorted(_listed()))
def test_every_name_api_md_lists_imports_from_the_module_it_names(module_name: str) -> None:
    module = _module(module_name)
    names = _listed()[module_name]
    missing = sorted(name for name in names if not hasattr(module, name))
    assert not missing, f"docs/api.md lists {missing} in {module_name}, which has none of them"
    exported = getattr(module, "__all__", None)
    if exported is not None:
        unoffered = sorted(names - set(exported))
        assert not unoffered, f"{module_name}.__all__ leaves out {unoffered}"


@pytest.mark.parametrize("module_name", sorted(_listed()))
def test_a_public_modules_all_offers_only_what_api_md_lists(module_name: str) -> None:
    """``__all__`` is what a user's star import and their editor offer: an internal name
    there reads as a promise docs/api.md does not make."""
    exported = getattr(_module(module_name), "__all__", None)
    if exported is None:
        return
    unlisted = set(exported) - _listed()[module_name]
    assert not unlisted, f"{module_name}.__all__ offers {sorted(unlisted)}, not in docs/api.md"


def test_the_roots_all_is_its_table_in_api_md() -> None:
    table = _root_table(API.read_text(encoding="utf-8"))
    exported = set(celery_agboss.__all__)
    assert exported - table == set(), "root names missing from docs/api.md"
    assert table - exported == set(), "docs/api.md's root table names what the root lacks"
    for name in table:
        assert getattr(celery_agboss, name) is not None
