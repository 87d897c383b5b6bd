"""Stop, kill, exit or hold a deployment's pool child at a named fault point.

A fault test cannot reach into a worker it started with the README's command, so it
describes the fault in the environment and this hook (imported by ``sitecustomize``
at interpreter start-up, before the worker forks its pool) arms it through
``celery_agboss.testing.fault_arming``. Unset, it imports nothing and arms nothing.

``AGBOSS_TEST_FAULT_POINTS`` is a JSON list of rules::

    {"point": "fenced.before-begin",   # a name of celery_agboss/core/fault_points.py
     "action": "stop",                 # stop (SIGSTOP), kill (SIGKILL), exit (SystemExit),
                                       # or hold (block this thread until `release` exists)
     "match": {"key": "..."},          # context values the hit must carry (optional)
     "match_end": {"key": "..."},      # ... or end with (a key whose tenant is not known
                                       # before the store is migrated) (optional)
     "within": "settle_result",        # a function that must be on the stack (optional)
     "effect": "mark-paid",            # only inside this fenced effect (optional)
     "flag": "zombie",                 # once across all processes: the first claimant wins
     "after": "zombie",                # only once another process claimed that flag
     "release": "go",                  # hold: the file whose creation ends the hold
     "children_only": true}            # default: the worker's pool children only

Flags live in ``AGBOSS_TEST_FAULT_DIR``: a flag is claimed by hard-linking a complete
file to its name (exclusive and atomic), holding ``{"pid", "point", "context"}``, so
the test reads which process stopped and under which lease token.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

POINTS_ENV = "AGBOSS_TEST_FAULT_POINTS"
DIR_ENV = "AGBOSS_TEST_FAULT_DIR"
HOLD_SECONDS = 90.0
"""A hold nobody releases gives up (and lets the thread go on) so no worker hangs."""

ACTIONS = ("stop", "kill", "exit", "hold")
STARTED_PID = os.getpid()  # the process Python started; pool children are its forks

Context = Mapping[str, object]


def _plain(value: object) -> object:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _frames() -> list[FrameType]:
    frame: FrameType | None = sys._getframe(1)
    found = []
    while frame is not None:
        found.append(frame)
        frame = frame.f_back
    return found


def _effect_on_stack() -> str | None:
    """The name of the fenced effect whose transaction the caller is in, if any."""
    for frame in _frames():
        if frame.f_code.co_name == "run_fenced_effect":
            name = frame.f_locals.get("name")
            return name if isinstance(name, str) else None
    return None


def _on_stack(function: str) -> bool:
    return any(frame.f_code.co_name == function for frame in _frames())


class Rule:
    """One armed rule of ``AGBOSS_TEST_FAULT_POINTS``."""

    def __init__(self, spec: Mapping[str, Any], directory: Path) -> None:
        self.point = str(spec["point"])
        self.action = str(spec.get("action", "stop"))
        if self.action not in ACTIONS:
            raise ValueError(f"{POINTS_ENV}: unknown action {self.action!r}; one of {ACTIONS}")
        self.match: dict[str, object] = dict(spec.get("match") or {})
        self.match_end: dict[str, str] = dict(spec.get("match_end") or {})
        self.within: str | None = spec.get("within")
        self.effect: str | None = spec.get("effect")
        self.flag: str | None = spec.get("flag")
        self.after: str | None = spec.get("after")
        self.release: str | None = spec.get("release")
        self.children_only = bool(spec.get("children_only", True))
        self.directory = directory
        if self.action == "hold" and not self.release:
            raise ValueError(f"{POINTS_ENV}: a hold needs a 'release' file name")

    def applies(self, context: Context) -> bool:
        """Cheap and side-effect free: called under the fault-point registry's lock."""
        if self.children_only and os.getpid() == STARTED_PID:
            return False
        if self.flag is not None and (self.directory / self.flag).exists():
            return False  # claimed already: let a later rule on this point have the hit
        if any(context.get(k) != v for k, v in self.match.items()):
            return False
        if any(not str(context.get(k)).endswith(v) for k, v in self.match_end.items()):
            return False
        if self.after is not None:
            claimed = _read_flag(self.directory / self.after)
            if claimed is None or claimed.get("pid") == os.getpid():
                return False
        if self.within is not None and not _on_stack(self.within):
            return False
        return self.effect is None or _effect_on_stack() == self.effect

    def fire(self, context: Context) -> None:
        if self.flag is not None and not self._claim(context):
            return
        if self.action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)  # the test continues it with SIGCONT
        elif self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.action == "exit":
            raise SystemExit(f"fault hook: SystemExit at {self.point}")
        else:
            assert self.release is not None
            released = self.directory / self.release
            deadline = time.monotonic() + HOLD_SECONDS
            while not released.exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    def _claim(self, context: Context) -> bool:
        """Claim the flag for this process; False when another process has it."""
        assert self.flag is not None
        target = self.directory / self.flag
        draft = self.directory / f".{self.flag}.{os.getpid()}.{time.monotonic_ns()}"
        record = {
            "pid": os.getpid(),
            "point": self.point,
            "context": {k: _plain(v) for k, v in context.items()},
        }
        draft.write_text(json.dumps(record), encoding="utf-8")
        try:
            os.link(draft, target)
        except FileExistsError:
            return False
        finally:
            draft.unlink()
        return True


def _read_flag(path: Path) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return found


def _arm(rules: list[Rule]) -> None:
    from celery_agboss.testing.fault_arming import arm_fault

    for rule in rules:
        only: Callable[[Context], bool] = rule.applies
        arm_fault(rule.point, rule.fire, times=sys.maxsize, only=only)


def install(environ: Mapping[str, str] = os.environ) -> list[Rule]:
    """Arm the rules the environment names (none when the variable is unset or empty)."""
    raw = environ.get(POINTS_ENV, "")
    if not raw:
        return []
    directory = Path(environ[DIR_ENV])
    rules = [Rule(spec, directory) for spec in json.loads(raw)]
    _arm(rules)
    return rules


install()
