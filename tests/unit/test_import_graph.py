"""The package's imports form layers with no circle (docs/architecture.md).

``LAYERS`` below is the one layer table: docs/architecture.md shows it, and a test
here fails when that page's table names other layers or other modules.

Every ``import`` of a ``celery_agboss`` module is read from the source with ``ast``
(deferred imports and ``TYPE_CHECKING`` ones included: a circle that only type
checking closes is still a circle for a reader), and held against the layer table
below. A module may import its own layer and the layers under it, never one above;
a new module must be given a layer here, so the table stays the map of the tree.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "celery_agboss"
ARCHITECTURE_MD = PACKAGE_DIR.parent / "docs" / "architecture.md"

# Bottom first. A name is a module, or a package followed by ".*" for all it holds.
LAYERS: list[tuple[str, list[str]]] = [
    ("core", ["celery_agboss.errors", "celery_agboss.core", "celery_agboss.core.*"]),
    # Gateway adapters: OutboundCalls over the official SDKs, needing only the core.
    ("adapters", ["celery_agboss.adapters", "celery_agboss.adapters.*"]),
    ("store", ["celery_agboss.store", "celery_agboss.store.*"]),
    ("runtime", ["celery_agboss.runtime", "celery_agboss.runtime.*"]),
    ("delivery", ["celery_agboss.delivery", "celery_agboss.delivery.*"]),
    # The transactional outbox: what a fenced effect enqueues, published after its commit.
    ("outbox", ["celery_agboss.outbox", "celery_agboss.outbox.*"]),
    ("task", ["celery_agboss.task"]),
    (
        "installed by AGBoss",
        [
            "celery_agboss.signals",
            "celery_agboss.signals.*",
            "celery_agboss.sweep",
            "celery_agboss.sweep.*",
            "celery_agboss.operator",
            "celery_agboss.operator.*",
            "celery_agboss.metrics",
            "celery_agboss.metrics.*",
            # What AGBoss installs on each worker: its store check, the messages it holds.
            "celery_agboss.worker",
            "celery_agboss.worker.*",
            # Webhook intake: signature checks, and events applied through PaymentTask.
            "celery_agboss.webhooks",
            "celery_agboss.webhooks.*",
        ],
    ),
    ("binding", ["celery_agboss.app", "celery_agboss"]),
    (
        "tools",
        [
            "celery_agboss.cli",
            "celery_agboss.cli.*",
            "celery_agboss.flower",
            "celery_agboss.testing",
            "celery_agboss.testing.*",
            "celery_agboss.chaos",
            "celery_agboss.chaos.*",
        ],
    ),
    # The frameworks payment code is written in: Django's app, its migrations, its
    # transactions and its manage.py command (which runs the CLI's group).
    ("frameworks", ["celery_agboss.contrib", "celery_agboss.contrib.*"]),
]

# Who may use one delivery: the task that drives it, and the delivery's own modules.
DELIVERY_USERS = ("celery_agboss.task", "celery_agboss.delivery")


def package_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        if "migrations" in path.parts:  # Alembic's scripts, run by Alembic only
            continue
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _owner(name: str, modules: Mapping[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (a ``from pkg import mod`` names ``mod``)."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(
                    _owner(alias.name, modules)
                    for alias in node.names
                    if alias.name.startswith("celery_agboss")
                )
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if not node.module.startswith("celery_agboss"):
                    continue
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else _owner(node.module, modules))
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(module: str) -> int | None:
    for number, (_, names) in enumerate(LAYERS):
        for name in names:
            if module == name or (name.endswith(".*") and module.startswith(name[:-1])):
                return number
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(package_modules())


def test_the_package_has_no_import_circle(graph: dict[str, set[str]]) -> None:
    assert circles(graph) == []


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    assert [module for module in sorted(graph) if layer_of(module) is None] == []


def test_no_module_imports_a_layer_above_its_own(graph: dict[str, set[str]]) -> None:
    upward = [
        f"{module} ({LAYERS[layer_of(module) or 0][0]}) imports {target} "
        f"({LAYERS[layer_of(target) or 0][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if (layer_of(target) or 0) > (layer_of(module) or 0)
    ]
    assert upward == []


def test_one_delivery_is_used_only_by_the_task(graph: dict[str, set[str]]) -> None:
    users = sorted(
        module
        for module, targets in graph.items()
        if any(
            t == "celery_agboss.delivery" or t.startswith("celery_agboss.delivery.")
            for t in targets
        )
        and not module.startswith(DELIVERY_USERS)
    )
    assert users == []


def test_the_circle_finder_sees_a_circle() -> None:
    """The twin of the first test: a graph with a circle is reported, so an empty
    answer above means the package has none, not that the finder is blind."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_graph_reader_sees_deferred_and_type_checking_imports(tmp_path: Path) -> None:
    """Also a twin: imports inside a function or under ``TYPE_CHECKING`` are arrows too."""
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from celery_agboss.b import X\n"
        "def f():\n    import celery_agboss.c\n",
        encoding="utf-8",
    )
    modules = {
        "celery_agboss.a": tmp_path / "a.py",
        "celery_agboss.b": tmp_path / "a.py",
        "celery_agboss.c": tmp_path / "a.py",
    }
    assert import_graph(modules)["celery_agboss.a"] == {"celery_agboss.b", "celery_agboss.c"}


def _as_written_in_the_doc(names: Iterable[str]) -> set[str]:
    """How docs/architecture.md writes a layer's names: ``core/`` for a package and all
    it holds, ``errors`` for a module, and "the package root" for ``celery_agboss``."""
    written: set[str] = set()
    packages = {name[: -len(".*")] for name in names if name.endswith(".*")}
    for name in names:
        if name == "celery_agboss":
            written.add("the package root")
        elif name.endswith(".*"):
            written.add(name[len("celery_agboss.") : -len(".*")].replace(".", "/") + "/")
        elif name not in packages:
            written.add(name[len("celery_agboss.") :].replace(".", "/"))
    return written


def architecture_table(text: str) -> list[tuple[str, set[str]]]:
    """The rows of the page's layer table: (layer, the names its modules cell gives)."""
    rows: list[tuple[str, set[str]]] = []
    lines = text.splitlines()
    start = lines.index("| layer | modules | holds |")
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        layer, modules = (cell.strip() for cell in line.strip("|").split("|")[:2])
        written = set(re.findall(r"`([^`]+)`", modules))
        if "the package root" in modules:
            written.add("the package root")
        rows.append((layer.replace("`", ""), written))
    return rows


def test_every_name_in_the_layer_table_is_a_module_of_the_package() -> None:
    """A stale name (a module moved or deleted) would let its old layer hide the new one."""
    modules = package_modules()
    stale = [
        name
        for _, names in LAYERS
        for name in names
        if not (
            name in modules
            or (name.endswith(".*") and any(m.startswith(name[:-1]) for m in modules))
        )
    ]
    assert stale == []


def test_the_architecture_page_shows_this_layer_table() -> None:
    """docs/architecture.md's table has these layers, in this order, each naming the
    modules placed here and no other: the page cannot drift from what is enforced."""
    expected = [(layer, _as_written_in_the_doc(names)) for layer, names in LAYERS]
    assert architecture_table(ARCHITECTURE_MD.read_text(encoding="utf-8")) == expected


def test_the_page_check_sees_a_module_missing_from_the_page() -> None:
    """The twin of the check above: a page that leaves a placed module out differs."""
    text = ARCHITECTURE_MD.read_text(encoding="utf-8").replace(", `chaos/`", "", 1)
    expected = [(layer, _as_written_in_the_doc(names)) for layer, names in LAYERS]
    assert architecture_table(text) != expected
