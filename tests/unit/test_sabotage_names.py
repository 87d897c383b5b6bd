"""Every sabotage switch has one home, ``celery_agboss.core.protections``, and no public
``__all__`` offers one: a switch is a test's tool, never part of what users import."""

from __future__ import annotations

import ast
from pathlib import Path

from celery_agboss.core import protections
from celery_agboss.core.sabotage import known
from celery_agboss.testing import sabotage

PACKAGE = Path(__file__).resolve().parents[2] / "celery_agboss"
HOME = PACKAGE / "core" / "protections"
SWITCH_NAMES = {name for name in vars(protections) if name.isupper() and name != "ALL"}


def _modules() -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _exported(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return set()


def test_every_switch_the_package_knows_is_named_in_its_home() -> None:
    values = {getattr(protections, name) for name in SWITCH_NAMES}
    assert protections.ALL == values == known()
    assert set(sabotage.names()) == values
    assert len(values) == len(SWITCH_NAMES), "two names for one switch"


def test_no_other_module_defines_a_switch() -> None:
    strays = []
    for path, tree in _modules():
        if HOME in path.parents:
            continue
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and node.value.value in protections.ALL
            ):
                strays.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not strays, f"switch names belong in core/protections/: {strays}"


def test_no_public_all_lists_a_switch() -> None:
    offered = {
        str(path.relative_to(PACKAGE)): sorted(_exported(tree) & SWITCH_NAMES)
        for path, tree in _modules()
        if _exported(tree) & SWITCH_NAMES
    }
    assert not offered
