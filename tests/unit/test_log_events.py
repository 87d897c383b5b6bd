"""One log schema: every structured log record of the package is written by
``celery_agboss.core.log_events.log_event``, under a name that module defines and
docs/api.md lists, in the shape docs/api.md promises.

The package is read with ``ast``: every ``log_event`` call names its event with one
of the module's constants (or forwards a parameter whose every caller does), every
constant is logged somewhere, no string literal spells an event name outside the
module, and no logging call passes ``extra=`` or starts its text with an event name.
"""

from __future__ import annotations

import ast
import functools
import logging
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from celery_agboss.core import log_events
from celery_agboss.core.log_events import (
    LOG_EVENTS,
    OUTBOUND_CALL_SENT,
    SWEEP_ERROR,
    SWEEP_FINISHED,
    add_event_observer,
    log_event,
    remove_event_observer,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "celery_agboss"
MODULE = "celery_agboss.core.log_events"
MODULE_FILE = PACKAGE_DIR / "core" / "log_events.py"
API_DOC = ROOT / "docs" / "api.md"

CONSTANTS = {
    name: value
    for name, value in vars(log_events).items()
    if name.isupper() and isinstance(value, str)
}
FAMILIES = {value.partition(".")[0] for value in LOG_EVENTS}
LOGGING_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}


@functools.cache
def _sources() -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of the package but the log events' own, parsed once for all tests
    (the trees are only read)."""
    return tuple(
        (path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if "migrations" not in path.parts and path != MODULE_FILE
    )


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _imported_constants(tree: ast.Module) -> dict[str, str]:
    """The constants a module imports from the log events module: local name → name."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == MODULE:
            names |= {
                alias.asname or alias.name: alias.name
                for alias in node.names
                if alias.name in CONSTANTS
            }
    return names


def _module_aliases(tree: ast.Module) -> set[str]:
    """The names a module gives the log events module itself."""
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "celery_agboss.core":
            aliases |= {
                alias.asname or alias.name for alias in node.names if alias.name == "log_events"
            }
    return aliases


def _constant_of(node: ast.expr, imported: dict[str, str], aliases: set[str]) -> str | None:
    """The constant's name when ``node`` is one of the module's constants, else None."""
    if isinstance(node, ast.Name) and node.id in imported:
        return imported[node.id]
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        and node.attr in CONSTANTS
    ):
        return node.attr
    return None


def _enclosing_parameters(tree: ast.Module) -> dict[ast.Call, set[str]]:
    """For each call, the parameters of the function it is written in (innermost)."""
    found: dict[ast.Call, set[str]] = {}

    def visit(node: ast.AST, parameters: set[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            parameters = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        if isinstance(node, ast.Call):
            found[node] = parameters
        for child in ast.iter_child_nodes(node):
            visit(child, parameters)

    visit(tree, set())
    return found


@functools.cache
def _event_calls() -> tuple[tuple[Path, ast.Call, bool, dict[str, str], set[str]], ...]:
    """``_event_calls_found`` once for all tests."""
    return tuple(_event_calls_found())


def _event_calls_found() -> Iterator[tuple[Path, ast.Call, bool, dict[str, str], set[str]]]:
    """Every call that names a log event: ``log_event(...)`` itself, and the calls of a
    function that forwards its parameter as the event (``self.log_decision(EVENT, ...)``, also
    from another module: ``d.log_decision(EVENT, ...)`` in the parts of a delivery).

    Yields (file, call, forwarded, imported constants, module aliases); ``forwarded``
    is True for a ``log_event`` call inside such a function, whose event is its
    parameter (its callers are yielded instead)."""
    sources = _sources()
    forwarded: set[ast.Call] = set()
    forwarders: set[str] = set()
    for _, tree in sources:
        parameters = _enclosing_parameters(tree)
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and _callee(node) == "log_event"
                    and node.args
                    and isinstance(node.args[0], ast.Name)
                    and node.args[0].id in parameters[node]
                ):
                    forwarded.add(node)
                    forwarders.add(function.name)
    for path, tree in sources:
        imported, aliases = _imported_constants(tree), _module_aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (
                _callee(node) == "log_event" or _callee(node) in forwarders
            ):
                yield path, node, node in forwarded, imported, aliases


def _documented_events() -> list[str]:
    """The first column of the log events table in docs/api.md."""
    text = API_DOC.read_text(encoding="utf-8")
    section = text.split("### Log events", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)


def test_every_documented_event_is_a_constant_and_every_constant_is_documented() -> None:
    documented = _documented_events()
    assert len(documented) == len(set(documented)), "an event is listed twice"
    assert set(documented) == LOG_EVENTS, (
        f"documented, not defined: {sorted(set(documented) - LOG_EVENTS)}; "
        f"defined, not documented: {sorted(LOG_EVENTS - set(documented))}"
    )


def test_the_constants_are_distinct_and_log_events_holds_them_all() -> None:
    assert len(set(CONSTANTS.values())) == len(CONSTANTS), "two constants, one name"
    assert set(CONSTANTS.values()) == LOG_EVENTS
    assert set(CONSTANTS) <= set(log_events.__all__)
    for value in LOG_EVENTS:
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*\.[a-z]+(-[a-z]+)*", value), value


def test_every_log_event_call_names_its_event_with_a_constant() -> None:
    wrong: list[str] = []
    seen = 0
    for path, call, forwarded, imported, aliases in _event_calls():
        if forwarded:
            continue  # its callers are checked instead
        if call.args and _constant_of(call.args[0], imported, aliases) is not None:
            seen += 1
            continue
        wrong.append(f"{_where(path, call)}: {ast.unparse(call.args[0]) if call.args else ''}")
    assert seen > 50, "the scan found too few calls: is it still reading the package?"
    assert wrong == [], "log_event must be given a constant of celery_agboss.core.log_events"


def test_every_constant_is_logged_somewhere() -> None:
    logged: set[str] = set()
    for _, call, _, imported, aliases in _event_calls():
        if call.args:
            name = _constant_of(call.args[0], imported, aliases)
            if name is not None:
                logged.add(CONSTANTS[name])
    assert sorted(LOG_EVENTS - logged) == [], "defined but never logged"


def test_log_event_is_defined_once_and_imported_from_its_module() -> None:
    wrong: list[str] = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name == "log_event"
            ):
                wrong.append(f"{_where(path, node)}: another log_event")
            if (
                isinstance(node, ast.ImportFrom)
                and node.module != MODULE
                and any(alias.name == "log_event" for alias in node.names)
            ):
                wrong.append(f"{_where(path, node)}: log_event from {node.module}")
    assert wrong == []


def test_no_string_literal_spells_an_event_name_outside_its_module() -> None:
    wrong = [
        f"{_where(path, node)}: {node.value!r}"
        for path, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in LOG_EVENTS
    ]
    assert wrong == [], "use the constant of celery_agboss.core.log_events"


def test_no_logging_call_bypasses_log_event() -> None:
    """No ``extra=`` on any call, and no logger call whose text starts with an event-like
    ``family.name`` (a structured event logged by hand, declared or not)."""
    event_like = re.compile(r"([a-z]+(-[a-z]+)*)\.[a-z]+(-[a-z]+)*(?=[:\s]|$)")
    wrong: list[str] = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if any(keyword.arg == "extra" for keyword in node.keywords):
                wrong.append(f"{_where(path, node)}: extra=")
            if not (isinstance(node.func, ast.Attribute) and node.func.attr in LOGGING_METHODS):
                continue
            for arg in node.args[:2]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found = event_like.match(arg.value)
                    if found and found.group(1) in FAMILIES:
                        wrong.append(f"{_where(path, node)}: {arg.value[:60]!r}")
    assert wrong == []


def test_no_log_event_call_names_a_field_that_logging_owns() -> None:
    """``log_event`` renames such a field (``name`` → ``name_``); the package never
    relies on that, so every field keeps the name the docs give it."""
    wrong = [
        f"{_where(path, call)}: {keyword.arg}"
        for path, call, _, _, _ in _event_calls()
        for keyword in call.keywords
        if keyword.arg is not None
        and keyword.arg not in {"exc_info"}
        and log_events.field_name(keyword.arg) != keyword.arg
    ]
    assert wrong == []


def test_the_docs_name_no_event_that_is_not_defined() -> None:
    """Backticked ``family.name`` spans in the docs (``sweep.finished by=worker``…) are
    events of the module."""
    families = "|".join(sorted(map(re.escape, FAMILIES)))
    span = re.compile(rf"`(({families})\.[a-z]+(-[a-z]+)*)(?=[` ])")
    wrong: list[str] = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for found in span.finditer(line):
                if found.group(1) not in LOG_EVENTS:
                    wrong.append(f"{doc.relative_to(ROOT)}:{number}: {found.group(1)}")
    assert wrong == []


# --- the record ------------------------------------------------------------------------


def _one_record(caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    records = [r for r in caplog.records if r.name == "celery_agboss"]
    assert len(records) == 1, records
    return records[0]


def test_a_record_has_the_promised_shape(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="celery_agboss")
    log_event(SWEEP_FINISHED, by="worker", republished=2, took=0.5, ok=True, tick=None)
    record = _one_record(caplog)
    attributes = vars(record)
    assert record.levelno == logging.INFO
    assert attributes["event"] == SWEEP_FINISHED
    assert {k: attributes[k] for k in ("by", "republished", "took", "ok", "tick")} == {
        "by": "worker",
        "republished": 2,
        "took": 0.5,
        "ok": True,
        "tick": None,
    }
    assert record.getMessage() == (
        "sweep.finished by=worker ok=True republished=2 tick=None took=0.5"
    )


def test_a_message_follows_the_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="celery_agboss")
    log_event(
        OUTBOUND_CALL_SENT, logging.WARNING, "sent and settled", call="shop.charge", attempt=1
    )
    record = _one_record(caplog)
    assert record.levelno == logging.WARNING
    assert vars(record)["event"] == OUTBOUND_CALL_SENT
    assert record.getMessage() == "outbound-call.sent attempt=1 call=shop.charge: sent and settled"


def test_a_value_that_is_not_plain_is_logged_as_its_type_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Never a repr, which could carry an amount or a card number (design: R17)."""
    caplog.set_level(logging.INFO, logger="celery_agboss")

    class Card:
        def __repr__(self) -> str:
            return "Card(4242424242424242)"

    log_event(
        SWEEP_FINISHED,
        amount=Decimal("12.50"),
        card=Card(),
        items=[1, "a", Decimal("3")],
        request={"amount": 1250},
    )
    attributes = vars(_one_record(caplog))
    assert (attributes["amount"], attributes["card"]) == ("Decimal", "Card")
    assert attributes["items"] == [1, "a", "Decimal"]
    assert attributes["request"] == "dict"
    assert "4242" not in caplog.text and "12.50" not in caplog.text and "1250" not in caplog.text


def test_a_field_named_like_a_record_attribute_gets_an_underscore(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="celery_agboss")
    log_event(SWEEP_FINISHED, name="mine", message="m", process=7, event="other")
    record = _one_record(caplog)
    attributes = vars(record)
    assert record.name == "celery_agboss" and attributes["event"] == SWEEP_FINISHED
    assert {k: attributes[k] for k in ("name_", "message_", "process_", "event_")} == {
        "name_": "mine",
        "message_": "m",
        "process_": 7,
        "event_": "other",
    }


def test_exc_info_keeps_the_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="celery_agboss")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log_event(SWEEP_ERROR, logging.ERROR, exc_info=True, step="run")
    record = _one_record(caplog)
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
    assert record.getMessage() == "sweep.error step=run"


class _BuiltWhenIterated(list[int]):
    """A field value whose making-safe would fail: shows whether a record was built."""

    def __iter__(self) -> Any:
        raise AssertionError("the event's fields were built")


def test_an_event_nobody_listens_to_builds_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="celery_agboss")
    log_event(OUTBOUND_CALL_SENT, call="shop.charge", attempts=_BuiltWhenIterated([1]))
    assert [r for r in caplog.records if r.name == "celery_agboss"] == []


def test_an_observer_hears_an_event_the_log_level_leaves_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="celery_agboss")
    heard: list[tuple[str, dict[str, Any]]] = []

    def observer(event: str, fields: Any) -> None:
        heard.append((event, dict(fields)))

    add_event_observer(observer)
    try:
        log_event(OUTBOUND_CALL_SENT, call="shop.charge", attempt=1)
    finally:
        remove_event_observer(observer)
    assert heard == [(OUTBOUND_CALL_SENT, {"call": "shop.charge", "attempt": 1})]
    assert [r for r in caplog.records if r.name == "celery_agboss"] == []
