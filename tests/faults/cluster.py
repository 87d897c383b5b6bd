"""A throwaway PostgreSQL cluster that a test may crash: ``initdb`` into a temporary
directory, ``pg_ctl start`` on a free port of 127.0.0.1 (no Unix socket), ``pg_ctl stop
-m immediate`` (every backend ends at once, nothing is flushed or rolled back cleanly:
the next start replays the WAL) and started again on the same port, so the URLs the
deployment was given stay valid.

The shared test server cannot be crashed: other tests use it. One cluster is made per
test session; a migrated store is built in it once as a template and each test gets a
copy (``tests/support/databases.py``).

``initdb`` and the server refuse to run as root, so as root (CI) every command runs as
the ``postgres`` user through ``runuser``, and the directory is given to that user
(found, and root dropped, as tests/support/throwaway.py does; where it cannot,
``throwaway.Unavailable``). The
postmaster is a daemon (``pg_ctl`` detaches it); :meth:`close` stops it, kills it and
its children by pid when ``pg_ctl`` could not, and removes the directory. Directories
of earlier runs whose test process is gone are stopped and removed the same way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import databases
from tests.support.databases import TemplateDatabase
from tests.support.throwaway import PostgresThrowaway, drop_root, free_ports

DIR_PREFIX = "agboss-pg-"
PG_CTL_SECONDS = 60  # a start replays the WAL of a crash; a loaded 2-core machine
COMMAND_SECONDS = 120.0
PORT_ATTEMPTS = 3
SERVER_OPTIONS = (
    "-c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
    # A crash of the server's processes is not one of the machine: what was committed
    # is in the kernel's page cache either way, so syncing it to disk proves nothing.
    "-c fsync=off -c max_connections=100"
)


class ClusterCommandFailed(Exception):
    """initdb or pg_ctl exited non-zero (the message holds its output)."""


@dataclass
class Cluster:
    """A cluster in ``root``; :meth:`create` makes and starts one."""

    root: Path
    bin_dir: Path
    prefix: list[str]
    port: int = 0
    initdb_seconds: float = 0.0
    first_start_seconds: float = 0.0
    _templates: dict[str, TemplateDatabase] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    # --- life --------------------------------------------------------------------------

    @classmethod
    def create(cls) -> Cluster:
        """initdb, then start on a free port; a failure leaves nothing behind."""
        bin_dir = PostgresThrowaway.find_bin_dir()
        prefix, user = drop_root("postgres")
        remove_stale_clusters(bin_dir, prefix)
        root = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-"))
        cluster = cls(root=root, bin_dir=bin_dir, prefix=prefix)
        try:
            if user is not None:
                os.chown(root, user.pw_uid, user.pw_gid)
            started = time.monotonic()
            cluster._command(
                "initdb",
                "-D",
                str(cluster.data_dir),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            )
            cluster.initdb_seconds = time.monotonic() - started
            started = time.monotonic()
            cluster._first_start()
            cluster.first_start_seconds = time.monotonic() - started
        except BaseException:
            cluster.close()
            raise
        return cluster

    def _first_start(self) -> None:
        """Start on a free port; another process may take it between the probe and the
        bind, so try a few."""
        for attempt in range(PORT_ATTEMPTS):
            (self.port,) = free_ports(1)
            try:
                self.start()
                return
            except ClusterCommandFailed:
                if attempt == PORT_ATTEMPTS - 1 or "could not bind" not in self.log():
                    raise

    def start(self) -> None:
        """Start (after a crash: replay the WAL first); returns when it accepts connections."""
        self._pg_ctl(
            "start",
            "-l",
            str(self.log_file),
            "-o",
            f"-p {self.port} {SERVER_OPTIONS}",
        )

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: every connection dies, uncommitted work is lost;
        returns when the postmaster and its children are gone."""
        self._pg_ctl("stop", "-m", "immediate")

    @property
    def running(self) -> bool:
        return self._postmaster_pid() is not None

    def ensure_running(self) -> None:
        if not self.running:
            self.start()

    def close(self) -> None:
        """Stop (immediately), kill by pid what is left, remove the directory."""
        try:
            stop_cluster(self.data_dir, self.bin_dir, self.prefix)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # --- databases ---------------------------------------------------------------------

    def template(self, name: str, prepare: Callable[[str], None]) -> TemplateDatabase:
        """A template database made once per cluster with ``prepare(url)``."""
        if name not in self._templates:
            self._templates[name] = databases.create_template(self.admin_url, name, prepare)
        return self._templates[name]

    def clone(self, template: TemplateDatabase) -> str:
        return databases.clone_database(template)

    def drop(self, url: str) -> None:
        databases.drop_database(self.admin_url, databases.database_name(url))

    # --- helpers -------------------------------------------------------------------------

    def log(self) -> str:
        try:
            return self.log_file.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def _postmaster_pid(self) -> int | None:
        return postmaster_pid(self.data_dir)

    def _pg_ctl(self, *args: str) -> None:
        try:
            self._command(
                "pg_ctl", "-D", str(self.data_dir), "-w", "-t", str(PG_CTL_SECONDS), *args
            )
        except ClusterCommandFailed as exc:
            raise ClusterCommandFailed(f"{exc}\nserver log:\n{self.tail()}") from None

    def _command(self, program: str, *args: str) -> None:
        run_as(self.prefix, [str(self.bin_dir / program), *args])


def run_as(prefix: list[str], argv: list[str]) -> None:
    """Run ``argv`` (as the postgres user when ``prefix`` says so) to its end."""
    result = subprocess.run(
        [*prefix, *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
        cwd="/",  # the postgres user may not enter the test's working directory
    )
    if result.returncode != 0:
        raise ClusterCommandFailed(
            f"{' '.join(argv)} exited with {result.returncode}: {result.stdout}{result.stderr}"
        )


def postmaster_pid(data_dir: Path) -> int | None:
    """The postmaster's pid from ``postmaster.pid``, if that process still runs."""
    try:
        first = (data_dir / "postmaster.pid").read_text(encoding="utf-8").splitlines()[0]
        pid = int(first)
    except (FileNotFoundError, IndexError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


def _children_of(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="utf-8")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            children.append(int(entry.name))
    return children


def stop_cluster(data_dir: Path, bin_dir: Path, prefix: list[str]) -> None:
    """``pg_ctl stop -m immediate``; if the postmaster is still there, SIGKILL it and its
    children by pid."""
    pid = postmaster_pid(data_dir)
    if pid is None:
        return
    with contextlib.suppress(ClusterCommandFailed, subprocess.SubprocessError):
        run_as(
            prefix,
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data_dir),
                "-w",
                "-t",
                "30",
                "stop",
                "-m",
                "immediate",
            ],
        )
    pid = postmaster_pid(data_dir)
    if pid is None:
        return
    for victim in [*_children_of(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def remove_stale_clusters(bin_dir: Path, prefix: list[str]) -> None:
    """Stop and remove the clusters of earlier test processes that are gone."""
    for root in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*-*"):
        owner = root.name[len(DIR_PREFIX) :].split("-", 1)[0]
        if not owner.isdigit() or int(owner) == os.getpid() or _alive(int(owner)):
            continue
        stop_cluster(root / "data", bin_dir, prefix)
        shutil.rmtree(root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
