"""The product as a user installs it: the wheel built from this tree, in a fresh virtualenv.

``build(root, workdir)`` runs the three commands a user's CI would run: ``pip wheel
--no-deps`` on the source tree, ``python3 -m venv`` (no ``--system-site-packages``)
with the machine's ``python3``, and ``<venv>/bin/pip install <wheel>`` with nothing
else. A command that fails raises :class:`BuildFailed` with its whole output.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

BUILD_TIMEOUT_SECONDS = 300.0
PACKAGE = "celery_agboss"


class BuildFailed(RuntimeError):
    """A build or install command failed; the message carries its output."""


@dataclass(frozen=True)
class DeployedVenv:
    """A fresh virtualenv holding the wheel and what it requires."""

    root: Path
    wheel: Path
    source_files: frozenset[str]  # the package's files in the tree during the whole build
    source_files_at_any_time: frozenset[str]  # ... before or after it

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    @property
    def pip(self) -> Path:
        return self.bin / "pip"

    def wheel_files(self) -> frozenset[str]:
        """The package's files in the wheel (``celery_agboss/…``)."""
        with zipfile.ZipFile(self.wheel) as archive:
            return frozenset(name for name in archive.namelist() if name.startswith(f"{PACKAGE}/"))


def run(argv: list[str], *, cwd: Path | None = None, timeout: float = BUILD_TIMEOUT_SECONDS) -> str:
    """Run a build step; its output, or :class:`BuildFailed` with that output."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = (exc.output or b"").decode(errors="replace")
        raise BuildFailed(f"{' '.join(argv)} ran over {timeout:g}s:\n{output}") from None
    output = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        raise BuildFailed(f"{' '.join(argv)} exited with {done.returncode}:\n{output}")
    return output


def package_files(root: Path) -> frozenset[str]:
    """The package's files in the source tree, as wheel names (no caches)."""
    found = set()
    for path in (root / PACKAGE).rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            found.add(path.relative_to(root).as_posix())
    return frozenset(found)


def machine_python() -> str:
    """The machine's ``python3`` (what a user's ``python3 -m venv`` would use)."""
    found = shutil.which("python3", path=os.environ.get("PATH"))
    if found is None:
        raise BuildFailed("no python3 on PATH")
    return found


WHEEL_BUILD_LOCK = Path(tempfile.gettempdir()) / "celery_agboss-wheel-build.lock"
"""Held while one test process builds the wheel: setuptools builds in the tree's
``build/`` directory, and two pytest-xdist workers building at once collide there."""

BUILT_RECORD = "deployed-venv.pickle"


def build(root: Path, workdir: Path) -> DeployedVenv:
    """Build the wheel from ``root``, make a fresh venv in ``workdir``, install the wheel
    (one build at a time on this machine: ``WHEEL_BUILD_LOCK``)."""
    with WHEEL_BUILD_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends
        return _build(root, workdir)


def build_once(root: Path, workdir: Path) -> DeployedVenv:
    """``build`` into ``workdir`` unless a finished build is already there (another test
    process of this session made it); the venv is only read by its tests, so one serves
    every pytest-xdist worker."""
    record = workdir / BUILT_RECORD
    with WHEEL_BUILD_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if record.exists():
            built: DeployedVenv = pickle.loads(record.read_bytes())
            return built
        deployed = _build(root, workdir)
        record.write_bytes(pickle.dumps(deployed))
        return deployed


def _build(root: Path, workdir: Path) -> DeployedVenv:
    wheels = workdir / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    before = package_files(root)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), str(root)])
    after = package_files(root)
    built = sorted(wheels.glob("celery_agboss-*.whl"))
    if len(built) != 1:
        raise BuildFailed(f"expected one celery_agboss wheel in {wheels}, found {built}")
    venv = workdir / "venv"
    run([machine_python(), "-m", "venv", str(venv)])
    run([str(venv / "bin" / "pip"), "install", str(built[0])])
    return DeployedVenv(
        root=venv,
        wheel=built[0],
        source_files=before & after,
        source_files_at_any_time=before | after,
    )


__all__ = ["BuildFailed", "DeployedVenv", "build", "build_once", "run"]
