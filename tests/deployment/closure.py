"""Run by the fresh venv's python: what is installed there beyond what the wheel requires.

``<venv>/bin/python closure.py celery-agboss`` prints one JSON object: ``required``
(the distributions the package's ``Requires-Dist`` pull in, extras and markers
followed, recursively), ``installed`` (every distribution in the venv), ``extra``
(installed, not required, not the venv's own pip and setuptools) and ``missing``.
It imports only the standard library and ``packaging`` (which the Redis transport
needs, so the wheel must bring it: its absence is the failure this suite exists for).
"""

from __future__ import annotations

import json
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

VENV_OWN = frozenset({"pip", "setuptools", "wheel"})


def _requirements(name: str, extras: frozenset[str]) -> list[Requirement]:
    wanted = []
    for text in metadata.distribution(name).requires or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": e}) for e in extras | {""}):
            wanted.append(requirement)
    return wanted


def closure(root: str) -> tuple[set[str], set[str]]:
    """The distributions ``root`` needs (recursively), and those needed but absent."""
    required: dict[str, frozenset[str]] = {}
    missing: set[str] = set()
    todo = [(canonicalize_name(root), frozenset[str]())]
    while todo:
        name, extras = todo.pop()
        known = required.get(name)
        if known is not None and extras <= known:
            continue
        required[name] = (known or frozenset()) | extras
        try:
            needs = _requirements(name, required[name])
        except metadata.PackageNotFoundError:
            missing.add(name)
            continue
        for requirement in needs:
            todo.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return set(required) - missing, missing


def main() -> int:
    required, missing = closure(sys.argv[1])
    installed = {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions()}
    report = {
        "required": sorted(required),
        "installed": sorted(installed),
        "extra": sorted(installed - required - VENV_OWN),
        "missing": sorted(missing),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
