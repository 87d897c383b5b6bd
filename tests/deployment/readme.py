"""What README.md tells a user to write and to run, read from README.md itself.

The suite deploys exactly this: the first ``python`` block of "Using it from Celery"
becomes ``shop.py``, and the ``sh`` block of "Running it" (plus the bullet that names
a second worker on one host) are the only commands it runs. If the README changes,
the tests run the new text; if a block disappears, they fail saying which.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"

USING_IT = "Using it from Celery"
RUNNING_IT = "Running it"

_FENCE = re.compile(r"^```(?P<lang>[A-Za-z0-9_+-]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)


class ReadmeError(AssertionError):
    """README.md no longer has what the deployment tests read from it."""


def section(title: str, text: str | None = None) -> str:
    """The body of the ``## title`` section (up to the next ``## `` heading)."""
    text = README.read_text(encoding="utf-8") if text is None else text
    match = re.search(rf"^## {re.escape(title)}[ \t]*\n(?P<body>.*?)(?=^## |\Z)", text, re.M | re.S)
    if match is None:
        raise ReadmeError(f"README.md has no section '## {title}'")
    return match.group("body")


def code_blocks(body: str, lang: str) -> list[str]:
    """The fenced blocks of ``body`` in language ``lang``, in order."""
    return [m.group("body") for m in _FENCE.finditer(body) if m.group("lang") == lang]


def shop_source(text: str | None = None) -> str:
    """The first ``python`` block of "Using it from Celery", unchanged: the app."""
    blocks = code_blocks(section(USING_IT, text), "python")
    if not blocks:
        raise ReadmeError(f"README.md's '## {USING_IT}' has no ```python block")
    return blocks[0]


@dataclass(frozen=True)
class ReadmeCommands:
    """The deployment commands of "Running it", each an argv (``shlex.split``)."""

    migrate: list[str]
    worker: list[str]
    beat: list[str]
    second_worker: list[str]  # the README's line for another worker on the same host


def _one(commands: list[list[str]], what: str, block: str) -> list[str]:
    if len(commands) != 1:
        raise ReadmeError(f"expected one {what} command in README.md's block, found:\n{block}")
    return commands[0]


def commands(text: str | None = None) -> ReadmeCommands:
    """Parse the ``sh`` block of "Running it" and its "several on one host" line."""
    body = section(RUNNING_IT, text)
    blocks = code_blocks(body, "sh")
    if len(blocks) != 1:
        raise ReadmeError(f"README.md's '## {RUNNING_IT}' should have one ```sh block")
    block = blocks[0]
    lines = [
        shlex.split(line)
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if len(lines) != 3:
        raise ReadmeError(f"expected the three deployment commands, found:\n{block}")
    migrate = _one([argv for argv in lines if argv[-1:] == ["migrate"]], "migrate", block)
    worker = _one([argv for argv in lines if "worker" in argv], "worker", block)
    beat = _one([argv for argv in lines if "beat" in argv], "beat", block)
    # The bullet naming a second worker on one host: an inline `celery … worker … -n …`.
    inline = [shlex.split(span) for span in re.findall(r"`(celery [^`]+)`", body)]
    second = [argv for argv in inline if "worker" in argv and "-n" in argv]
    if not second:
        raise ReadmeError(
            f"README.md's '## {RUNNING_IT}' no longer names a second worker's command "
            "(`celery … worker … -n name@%h`)"
        )
    return ReadmeCommands(migrate=migrate, worker=worker, beat=beat, second_worker=second[0])


__all__ = ["ReadmeCommands", "ReadmeError", "commands", "section", "shop_source"]
