"""What the Django deployment tests share: docs/django.md's own blocks, the environment
of a process of the installed project, and killing a whole worker (test_recovery.py's too).

The virtualenvs are fixtures (``django_venv``, ``django_stripe_venv``:
tests/deployment/conftest.py).
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from tests.support.processes import ManagedProcess, wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs" / "django.md"
KILL_SECONDS = 10.0


def docs_text() -> str:
    return DOCS.read_text(encoding="utf-8")


def docs_python_blocks() -> list[str]:
    """Every ``python`` block of docs/django.md, in order."""
    return re.findall(r"^```python\n(.*?)^```", docs_text(), re.M | re.S)


def docs_celery_py() -> str:
    """docs/django.md's ``proj/celery.py`` block, as written."""
    found = [b for b in docs_python_blocks() if 'config_from_object("django.conf:settings"' in b]
    assert found, "docs/django.md no longer has its proj/celery.py block"
    return found[0]


def assert_docs_say(*snippets: str) -> None:
    """The settings a test writes are the page's: each snippet must still be on it, so a
    renamed setting fails here rather than leaving the test on a name users no longer see."""
    text = docs_text()
    missing = [s for s in snippets if s not in text]
    assert not missing, f"docs/django.md no longer says {missing}"


def project_environment(venv_root: Path, **extra: str) -> dict[str, str]:
    """The environment of one of the project's processes, as a user's shell with the venv
    activated: the installed wheel, not this tree (CPython ignores an empty
    ``PYTHONPATH``), and none of the test process's ``AGBOSS_*``/``CELERY_*`` variables
    (the sabotage switch above all; the product reads an empty one as unset)."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update({k: "" for k in os.environ if k.startswith(("AGBOSS_", "CELERY_"))})
    env.update(
        {
            "PATH": os.pathsep.join([str(venv_root / "bin"), os.environ.get("PATH", "")]),
            "VIRTUAL_ENV": str(venv_root),
            "PYTHONPATH": "",
            **extra,
        }
    )
    return env


def kill_the_worker(worker: ManagedProcess) -> None:
    """SIGKILL the worker's main process and its pool children at once (an OOM kill, a
    lost host); returns once none of them is left."""
    worker.send_signal(signal.SIGKILL)
    worker.wait(KILL_SECONDS)
    wait_until(
        lambda: not worker.group_pids(),
        KILL_SECONDS,
        message=f"every process of {worker.name} to be gone",
    )
