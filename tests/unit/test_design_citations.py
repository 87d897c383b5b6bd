"""Every rule the code leans on is cited by a name docs/design.md defines.

docs/design.md's "How to cite" sets one form, an opening parenthesis, ``design:`` and the
names from its index table, and an anchor in the file for each name. These tests keep the repository
explaining itself: no comment points at a section number or at a design kept outside
the repository, every cited name is in the index, every index name has its anchor, and
every link into design.md from the other docs lands on one.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"

SOURCE_DIRS = ("celery_agboss", "tests", "example_project", "bench")
"""Where citations live (Python files)."""

SECTION_SIGN = "\N{SECTION SIGN}"
FORBIDDEN = (
    # Spelled in parts, so that this file does not match itself.
    ("DESIGN " + SECTION_SIGN, "a section of a design outside the repository"),
    ("shared/" + "DESIGN", "a design file outside the repository"),
    ("seeds" + "/", "the seed files outside the repository"),
)
SECTION_NUMBER = re.compile(re.escape(SECTION_SIGN) + r"\s*\d")
"""A section sign and a number: a section number, which design.md's names replace."""

KEYWORD = "design" + ":"  # in parts, so that this file does not cite itself
CITATION = re.compile(r"\(" + KEYWORD + r" ([^()\n]*)\)")
OPENED = re.compile(r"\(" + KEYWORD)
BARE_NAME = re.compile(r"\btrap \d+\b|\b(?:PS|R|G|A|P)\d+\b")
"""A guarantee, assumption, scenario, race, gateway requirement or trap named outside
the citation form."""


def _index() -> set[str]:
    """The names of design.md's index table (each in backticks, second column)."""
    text = DESIGN.read_text(encoding="utf-8")
    part = text.split("### Index of citable names", 1)[1]
    names: set[str] = set()
    for line in part.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = line.split("|")
        if len(cells) >= 4 and not cells[1].strip().startswith(("part", "---")):
            names.update(re.findall(r"`([^`]+)`", cells[2]))
    return names


def _anchor(name: str) -> str:
    """The anchor design.md gives a name: lower case, each other run made one ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower())


def _anchors() -> set[str]:
    return set(re.findall(r'<a id="([^"]+)"></a>', DESIGN.read_text(encoding="utf-8")))


def _python_files() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py"))


def _text_files() -> list[Path]:
    return [*_python_files(), *sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def citation_problems(files: list[Path], names: set[str]) -> list[str]:
    """Each citation whose name is not in the index, or that is not closed on its line."""
    problems = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            closed = CITATION.findall(line)
            if len(OPENED.findall(line)) != len(closed):
                problems.append(f"{_rel(path)}:{n}: a citation not closed on its line")
            for cited in closed:
                for name in cited.split(", "):
                    if name not in names:
                        problems.append(f"{_rel(path)}:{n}: {name!r} is not in the index")
    return problems


def _prose_lines(source: str) -> dict[int, str]:
    """The comments and docstrings of a module, by line: what cites, not what runs."""
    lines = source.splitlines()
    prose: dict[int, str] = {}
    for node in ast.walk(ast.parse(source)):
        value = node.value if isinstance(node, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            assert node.end_lineno is not None
            for n in range(node.lineno, node.end_lineno + 1):
                prose[n] = lines[n - 1]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            prose[token.start[0]] = token.string
    return prose


def bare_names(files: list[Path]) -> list[str]:
    """Names cited outside the citation form in comments and docstrings."""
    found = []
    for path in files:
        for n, line in sorted(_prose_lines(path.read_text(encoding="utf-8")).items()):
            for name in BARE_NAME.findall(CITATION.sub("", line)):
                found.append(f"{_rel(path)}:{n}: {name!r}")
    return found


def test_the_index_is_read() -> None:
    names = _index()
    assert {"P1", "claim", "trap 4", "PS10", "R18", "G1", "another holder's lease"} <= names


def test_every_index_name_has_its_anchor() -> None:
    anchors = _anchors()
    missing = sorted(name for name in _index() if _anchor(name) not in anchors)
    assert not missing, f"names of the index with no anchor in design.md: {missing}"


@pytest.mark.parametrize(("text", "what"), FORBIDDEN)
def test_nothing_points_outside_the_repository(text: str, what: str) -> None:
    hits = [
        f"{_rel(p)}:{n}"
        for p in _text_files()
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if text in line
    ]
    assert not hits, f"{what} is cited at: {hits}"


def test_no_section_numbers() -> None:
    hits = [
        f"{_rel(p)}:{n}: {line.strip()}"
        for p in [*_text_files(), DESIGN]
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if SECTION_NUMBER.search(line)
    ]
    assert not hits, f"section numbers, where design.md has names: {hits}"


def test_every_cited_name_is_in_the_index() -> None:
    problems = citation_problems(_python_files(), _index())
    assert not problems, "\n".join(problems)


def test_the_package_cites_only_in_the_citation_form() -> None:
    found = bare_names(sorted((ROOT / "celery_agboss").rglob("*.py")))
    assert not found, "write these in the citation form of design.md:\n" + "\n".join(found)


def test_links_into_design_md_land_on_an_anchor() -> None:
    anchors = _anchors()
    broken = [
        f"{_rel(p)}: #{anchor}"
        for p in sorted((ROOT / "docs").glob("*.md"))
        for anchor in re.findall(r"\(design\.md#([^)\s]+)\)", p.read_text(encoding="utf-8"))
        if anchor not in anchors
    ]
    assert not broken, f"links to anchors design.md does not have: {broken}"


def test_a_name_outside_the_index_is_caught(tmp_path: Path) -> None:
    """The check itself: an unknown name, and a citation cut across lines, are reported."""
    planted = tmp_path / "planted.py"
    opened = "(" + KEYWORD
    planted.write_text(f'"""Held once {opened} claim, trap 99).\n\nSplit {opened}\nclaim)."""\n')
    problems = citation_problems([planted], _index())
    assert len(problems) == 2
    assert "'trap 99' is not in the index" in problems[0]
