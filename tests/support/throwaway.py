"""Throwaway PostgreSQL, Redis and RabbitMQ, so ``make test`` runs on a machine
where they are installed but not running.

``python -m tests.support.throwaway [--only NAMES] -- COMMAND...`` checks each
service as the tests find it (:mod:`tests.support.services`). For one that does
not answer and whose server is installed, it starts an instance of its own in a
temporary directory on free loopback ports, and runs COMMAND with the service's
``AGBOSS_TEST_*_URL`` pointing at it (plus what ``rabbitmqctl`` needs to reach a
throwaway RabbitMQ node); services that answer, and every other variable, are left
alone. Where the server is missing it says, in one line per service, which
variable to set and which compose command starts one, and runs COMMAND anyway
(those tests skip, or fail under CI). It returns COMMAND's exit code and stops
what it started, on Ctrl-C and SIGTERM too.

Servers detach from us (``pg_ctl`` daemonizes the postmaster; ``su`` and
``erl_child_setup`` start sessions of their own), so process groups cannot find
them. Instead every process started for an instance carries
``AGBOSS_THROWAWAY_DIR=<its directory>`` in its environment, which its children
inherit: stopping an instance ends every process with that entry, and a directory
whose wrapper died without cleaning up (SIGKILL) is swept on the next run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import ClassVar

from tests.support import services
from tests.support.services import Service

COMPOSE_COMMAND = (
    "docker compose -f docker/compose.yaml --profile test up -d postgres redis rabbitmq"
)
DIR_PREFIX = "agboss-throwaway-"
MARKER_ENV = "AGBOSS_THROWAWAY_DIR"
HOST = "127.0.0.1"
PORT_ATTEMPTS = 3
COMMAND_SECONDS = 120.0
POLL_SECONDS = 0.2
STOP_SECONDS = 30.0
KILL_SECONDS = 10.0

# --- processes, found by the marker in their environment ------------------------------


def marked_pids(root: Path) -> list[int]:
    """Live processes started for the instance in ``root`` (Linux; elsewhere none)."""
    entry = f"{MARKER_ENV}={root}".encode()
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    found = []
    for path in proc.iterdir():
        if not path.name.isdigit() or int(path.name) == os.getpid():
            continue
        try:
            environ = (path / "environ").read_bytes()
        except OSError:  # gone, or another user's process we could not kill anyway
            continue
        if entry in environ.split(b"\0"):
            found.append(int(path.name))
    return found


def signal_pids(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_for(predicate: Callable[[], bool], seconds: float) -> bool:
    """Poll ``predicate`` until it is true or ``seconds`` pass; returns its last value."""
    deadline = time.monotonic() + seconds
    while not predicate():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(POLL_SECONDS, remaining))
    return True


def kill_marked(root: Path) -> None:
    """SIGKILL every process of the instance in ``root`` and wait until they are gone."""
    for _ in range(3):  # a dying parent may fork once more; bounded
        pids = marked_pids(root)
        if not pids:
            return
        signal_pids(pids, signal.SIGKILL)
        wait_for(lambda: not marked_pids(root), KILL_SECONDS)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[Path]:
    """Kill the processes and remove the directories of wrappers that are gone."""
    swept = []
    for root in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*"):
        owner = root.name[len(DIR_PREFIX) :].split("-", 1)[0]
        if not owner.isdigit() or int(owner) == os.getpid() or _alive(int(owner)):
            continue
        kill_marked(root)
        shutil.rmtree(root, ignore_errors=True)
        swept.append(root)
    return swept


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports of 127.0.0.1 that nothing listens on right now."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def drop_root(user: str) -> tuple[list[str], pwd.struct_passwd | None]:
    """The prefix that runs a command as ``user`` when we are root (servers refuse root)."""
    if os.geteuid() != 0:
        return [], None
    runuser = shutil.which("runuser")
    if runuser is None:
        raise Unavailable("this runs as root and there is no runuser to drop it")
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise Unavailable(f"this runs as root and there is no {user} user to run it as") from None
    return [runuser, "-u", account.pw_name, "--"], account


def chown_tree(root: Path, account: pwd.struct_passwd | None) -> None:
    if account is None:
        return
    for path in [root, *root.rglob("*")]:
        os.chown(path, account.pw_uid, account.pw_gid)


def tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())


def is_ready(service: Service, url: str) -> bool:
    """One real handshake, not cached (:func:`services.unreachable_reason` caches)."""
    return services.unreachable_reason.__wrapped__(service, url) is None


# --- errors ---------------------------------------------------------------------------


class Unavailable(Exception):
    """The server is not installed here (or cannot be run by this user)."""


class StartFailed(Exception):
    """The throwaway server did not start; the message says what it printed."""

    def __init__(self, message: str, *, port_taken: bool = False) -> None:
        super().__init__(message)
        self.port_taken = port_taken


_PORT_TAKEN = ("address already in use", "eaddrinuse", "could not bind")


def _port_taken(text: str) -> bool:
    lowered = text.lower()
    return any(needle in lowered for needle in _PORT_TAKEN)


class Interrupted(BaseException):
    """SIGTERM or SIGHUP reached the wrapper while it was starting instances."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# --- instances ------------------------------------------------------------------------


class Throwaway:
    """One throwaway server: its directory, its ports and the processes we started."""

    service: ClassVar[Service]
    slug: ClassVar[str]
    program: ClassVar[str]

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-{self.slug}-"))
        self.port = 0
        self.start_seconds = 0.0
        self.children: list[subprocess.Popen[bytes]] = []

    @classmethod
    def locate(cls) -> None:
        """Raise :class:`Unavailable` when this machine cannot run the server."""
        raise NotImplementedError

    @property
    def url(self) -> str:
        raise NotImplementedError

    def child_env(self) -> dict[str, str]:
        """What the command run under the wrapper needs to use this instance."""
        return {self.service.env_var: self.url}

    def detail(self) -> str:
        return f"{self.program} in {self.root}"

    def start(self) -> None:
        """Start on free ports (another attempt when one was taken meanwhile), and
        return once it answers a real handshake."""
        started = time.monotonic()
        self.prepare()
        for attempt in range(PORT_ATTEMPTS):
            try:
                self.launch()
                break
            except StartFailed as exc:
                if not exc.port_taken or attempt == PORT_ATTEMPTS - 1:
                    raise
                self.end_processes()
        self.start_seconds = time.monotonic() - started

    def prepare(self) -> None:
        """Once, before the first launch (initdb, config files)."""

    def launch(self) -> None:
        raise NotImplementedError

    def stop_gracefully(self) -> None:
        """Ask the server to stop; :meth:`close` kills what is left afterwards."""

    def close(self) -> None:
        """Stop the server, kill whatever is left of it, remove the directory."""
        try:
            with contextlib.suppress(Exception):
                self.stop_gracefully()
            wait_for(lambda: not marked_pids(self.root), STOP_SECONDS)
        finally:
            self.end_processes()
            shutil.rmtree(self.root, ignore_errors=True)

    def end_processes(self) -> None:
        kill_marked(self.root)
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=KILL_SECONDS)
        self.children.clear()

    # helpers for the subclasses

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **(extra or {}), MARKER_ENV: str(self.root)}

    def spawn(
        self, argv: Sequence[str], log: Path, extra: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a long-running process in a session of its own (so the terminal's
        Ctrl-C reaches the command, not the servers it is using)."""
        with open(log, "ab") as out:
            child = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(extra),
                cwd=self.root,
                start_new_session=True,
            )
        self.children.append(child)
        return child

    def run(self, argv: Sequence[str], log: Path) -> None:
        """Run a setup command to its end; :class:`StartFailed` if it fails."""
        with open(log, "ab") as out:
            try:
                done = subprocess.run(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env(),
                    cwd=self.root,
                    start_new_session=True,
                    timeout=COMMAND_SECONDS,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise StartFailed(f"{Path(argv[0]).name} ran over {COMMAND_SECONDS:g}s") from None
        if done.returncode != 0:
            text = tail(log)
            raise StartFailed(
                f"{Path(argv[0]).name} exited with {done.returncode}: {text}",
                port_taken=_port_taken(text),
            )

    def wait_ready(self, child: subprocess.Popen[bytes], log: Path, seconds: float) -> None:
        """Until a real handshake succeeds; :class:`StartFailed` if the server exits
        first or ``seconds`` pass."""
        deadline = time.monotonic() + seconds
        while not is_ready(self.service, self.url):
            if child.poll() is not None:
                text = tail(log, 8)
                raise StartFailed(
                    f"{self.program} exited with {child.returncode}: {text}",
                    port_taken=_port_taken(text),
                )
            if time.monotonic() >= deadline:
                raise StartFailed(f"{self.program} did not answer within {seconds:g}s")
            time.sleep(POLL_SECONDS)


class PostgresThrowaway(Throwaway):
    """``initdb`` (user ``postgres``, trust), ``pg_ctl start``, database ``test``."""

    service = services.POSTGRES
    slug = "postgres"
    program = "initdb"
    READY_SECONDS = 60
    OPTIONS = "-c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"

    def __init__(self) -> None:
        self.bin_dir = self.find_bin_dir()
        self.prefix, self.account = drop_root("postgres")
        super().__init__()

    @staticmethod
    def find_bin_dir() -> Path:
        """The directory of one version's ``initdb``, ``pg_ctl`` and ``postgres``
        (``initdb`` on PATH may be a link into it; Debian keeps them off PATH)."""
        candidates: list[Path] = []
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(Path(on_path).resolve().parent)
        candidates.extend(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True))
        for directory in candidates:
            if all((directory / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
                return directory
        raise Unavailable("initdb/pg_ctl are not installed")

    @classmethod
    def locate(cls) -> None:
        cls.find_bin_dir()
        drop_root("postgres")

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@{HOST}:{self.port}/test"

    def detail(self) -> str:
        return f"initdb in {self.root}"

    def prepare(self) -> None:
        chown_tree(self.root, self.account)
        self.run(
            [
                *self.prefix,
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            self.root / "initdb.log",
        )

    def launch(self) -> None:
        (self.port,) = free_ports(1)
        options = f"-p {self.port} -k {shlex.quote(str(self.root))} {self.OPTIONS}"
        try:
            self.run(
                self.pg_ctl("-l", str(self.log), "-o", options, "start"), self.root / "pg_ctl.log"
            )
        except StartFailed as exc:
            text = tail(self.log, 8)
            raise StartFailed(f"{exc} {text}", port_taken=_port_taken(text)) from None
        import psycopg

        admin = f"postgresql://postgres@{HOST}:{self.port}/postgres"
        try:
            with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
                conn.execute("CREATE DATABASE test")
        except psycopg.Error as exc:
            raise StartFailed(f"CREATE DATABASE test failed: {exc}") from None
        if not wait_for(lambda: is_ready(self.service, self.url), self.READY_SECONDS):
            raise StartFailed(f"database test did not answer within {self.READY_SECONDS}s")

    def pg_ctl(self, *args: str) -> list[str]:
        return [
            *self.prefix,
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.data_dir),
            "-w",
            "-t",
            str(self.READY_SECONDS),
            *args,
        ]

    def stop_gracefully(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self.run(self.pg_ctl("stop", "-m", "fast"), self.root / "pg_ctl.log")


class RedisThrowaway(Throwaway):
    """``redis-server`` on loopback, nothing saved to disk."""

    service = services.REDIS
    slug = "redis"
    program = "redis-server"
    READY_SECONDS = 30.0

    @classmethod
    def locate(cls) -> None:
        if shutil.which("redis-server") is None:
            raise Unavailable("redis-server is not installed")

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}"

    def command(self) -> list[str]:
        return [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.root),
            "--daemonize",
            "no",
            "--databases",
            "16",  # the tests lease databases 1-15
        ]

    def launch(self) -> None:
        (self.port,) = free_ports(1)
        log = self.root / "redis.log"
        child = self.spawn(self.command(), log)
        self.wait_ready(child, log, self.READY_SECONDS)

    def stop_gracefully(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.terminate()


class RabbitmqThrowaway(Throwaway):
    """A RabbitMQ node of its own name, config, plugins and data, on an ``epmd`` of
    its own, so ``rabbitmqctl`` (vhosts for the deployment tests) reaches it through
    ``RABBITMQ_NODENAME`` and ``ERL_EPMD_PORT``, and nothing outlives it."""

    service = services.RABBITMQ
    slug = "rabbitmq"
    program = "rabbitmq-server"
    READY_SECONDS = 120.0
    # +sbwt none: its schedulers otherwise busy-wait on a core; the Erlang
    # distribution listens on loopback only.
    ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none -kernel inet_dist_use_interface {127,0,0,1}"

    def __init__(self) -> None:
        self.server, self.epmd = self.find_programs()
        super().__init__()
        self.node = f"agboss-throwaway-{os.getpid()}-{uuid.uuid4().hex[:6]}@localhost"
        self.dist_port = 0
        self.epmd_port = 0
        self.account = self.server_account()

    @staticmethod
    def find_programs() -> tuple[str, str]:
        server = shutil.which("rabbitmq-server") or shutil.which(
            "rabbitmq-server", path="/usr/sbin:/usr/local/sbin"
        )
        if server is None:
            raise Unavailable("rabbitmq-server is not installed")
        epmd = shutil.which("epmd")
        if epmd is None:
            raise Unavailable("epmd (Erlang) is not on PATH")
        return server, epmd

    @staticmethod
    def server_account() -> pwd.struct_passwd | None:
        """As root, packaged servers (Debian's wrapper) drop to the ``rabbitmq`` user,
        which must own the directory."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam("rabbitmq")
        except KeyError:
            return None

    @classmethod
    def locate(cls) -> None:
        cls.find_programs()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.port}//"

    def detail(self) -> str:
        return f"node {self.node} in {self.root}"

    def child_env(self) -> dict[str, str]:
        return {
            **super().child_env(),
            "RABBITMQ_NODENAME": self.node,
            "ERL_EPMD_PORT": str(self.epmd_port),
        }

    def server_env(self) -> dict[str, str]:
        root = self.root
        return {
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(root / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(root / "log"),
            "RABBITMQ_PID_FILE": str(root / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": self.ERL_ARGS,
        }

    def write_config(self) -> None:
        (self.root / "rabbitmq-env.conf").write_text("", encoding="utf-8")
        (self.root / "enabled_plugins").write_text("[].\n", encoding="utf-8")
        (self.root / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {HOST}:{self.port}\n", encoding="utf-8"
        )
        for name in ("mnesia", "log"):
            (self.root / name).mkdir(exist_ok=True)
        chown_tree(self.root, self.account)

    def launch(self) -> None:
        self.port, self.dist_port, self.epmd_port = free_ports(3)
        self.write_config()
        epmd_log = self.root / "epmd.log"
        epmd = self.spawn([self.epmd, "-address", HOST, "-port", str(self.epmd_port)], epmd_log)
        if not wait_for(lambda: self.listening(self.epmd_port) or epmd.poll() is not None, 10):
            raise StartFailed("epmd did not listen within 10s")
        if epmd.poll() is not None:
            text = tail(epmd_log)
            raise StartFailed(f"epmd exited: {text}", port_taken=True)
        log = self.root / "server.log"
        server = self.spawn([self.server], log, self.server_env())
        try:
            self.wait_ready(server, log, self.READY_SECONDS)
        except StartFailed as exc:
            node_log = tail(self.root / "log" / f"{self.node}.log", 8)
            raise StartFailed(
                f"{exc} {node_log}", port_taken=exc.port_taken or _port_taken(node_log)
            ) from None

    @staticmethod
    def listening(port: int) -> bool:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
            return True
        return False

    def beam_pids(self) -> list[int]:
        pids = []
        for pid in marked_pids(self.root):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip() == "beam.smp":
                    pids.append(pid)
        return pids

    def stop_gracefully(self) -> None:
        """SIGTERM to the Erlang VM stops the node cleanly (its start script does not
        pass one on); then the epmd that only it used."""
        signal_pids(self.beam_pids(), signal.SIGTERM)
        wait_for(lambda: not self.beam_pids(), STOP_SECONDS)
        for child in self.children:
            if child.poll() is None:
                child.terminate()


THROWAWAYS: tuple[type[Throwaway], ...] = (PostgresThrowaway, RedisThrowaway, RabbitmqThrowaway)


# --- what the wrapper says ----------------------------------------------------------


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def started_line(instance: Throwaway, was: str) -> str:
    return (
        f"{instance.service.name} was not answering at {services.redact(was)}: started a "
        f"throwaway instance on {HOST}:{instance.port} ({instance.detail()}) in "
        f"{instance.start_seconds:.1f}s; {instance.service.env_var} points at it for this run"
    )


def help_line(service: Service, url: str, why: str) -> str:
    return (
        f"{service.name} is not answering at {services.redact(url)} and {why}: set "
        f"{service.env_var} to one, or start one with `{COMPOSE_COMMAND}`"
    )


# --- the wrapper -----------------------------------------------------------------------


@contextlib.contextmanager
def signals_handled(
    handlers: dict[int, Callable[[int, FrameType | None], None] | int],
) -> Iterator[None]:
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def start_missing(kinds: Sequence[type[Throwaway]], started: list[Throwaway]) -> dict[str, str]:
    """Start a throwaway instance of each service that does not answer (appending it to
    ``started`` before it starts, so a failure or Ctrl-C still cleans it up); returns
    the variables the command needs."""
    env: dict[str, str] = {}
    for kind in kinds:
        service = kind.service
        url = services.resolve_url(service)
        if services.unreachable_reason(service, url) is None:
            continue
        try:
            kind.locate()
        except Unavailable as exc:
            say(help_line(service, url, str(exc)))
            continue
        instance: Throwaway | None = None
        try:
            instance = kind()
            started.append(instance)
            instance.start()
        except Exception as exc:  # Unavailable, StartFailed, OSError; say it, go on
            if instance is not None:
                started.remove(instance)
                instance.close()
            say(help_line(service, url, f"a throwaway {service.name} did not start ({exc})"))
            continue
        env.update(instance.child_env())
        say(started_line(instance, url))
    return env


def in_terminal_foreground() -> bool:
    """True when our process group is the terminal's foreground one: the terminal's
    Ctrl-C then reaches the command as well as us."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            return os.tcgetpgrp(fd) == os.getpgrp()
    return False


def run_command(command: Sequence[str], env: dict[str, str]) -> int:
    """Run ``command`` in our process group, so the terminal's Ctrl-C reaches it
    directly (we pass SIGINT on only when no terminal did); SIGTERM and SIGHUP are
    passed on. Returns its exit code (128+N for signal N, as a shell does)."""
    try:
        child = subprocess.Popen(list(command), env=env)
    except OSError as exc:
        say(f"cannot run {command[0]}: {exc}")
        return 127

    def forward(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and in_terminal_foreground():
            return
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    with signals_handled({sig: forward for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}):
        code = child.wait()
    return 128 - code if code < 0 else code


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.throwaway",
        description="Run COMMAND with throwaway test services for those that do not answer.",
    )
    parser.add_argument(
        "--only",
        default=",".join(kind.slug for kind in THROWAWAYS),
        help="comma-separated services to consider (postgres,redis,rabbitmq: all)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(list(argv))
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no COMMAND given (python -m tests.support.throwaway -- COMMAND...)")
    slugs = {kind.slug: kind for kind in THROWAWAYS}
    wanted = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in slugs]
    if unknown:
        parser.error(f"--only: unknown {', '.join(unknown)} (known: {', '.join(slugs)})")
    args.kinds = [slugs[name] for name in wanted]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started: list[Throwaway] = []
    try:
        with signals_handled(
            {signal.SIGTERM: _raise_interrupted, signal.SIGHUP: _raise_interrupted}
        ):
            sweep_stale()
            env = start_missing(args.kinds, started)
        return run_command(args.command, {**os.environ, **env})
    except Interrupted as exc:
        return 128 + exc.signum
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        # Cleanup is bounded by its own deadlines; a second Ctrl-C must not cut it short.
        ignored = signal.SIG_IGN
        with signals_handled(
            {signal.SIGINT: ignored, signal.SIGTERM: ignored, signal.SIGHUP: ignored}
        ):
            for instance in reversed(started):
                try:
                    instance.close()
                except Exception as exc:  # report and go on with the others
                    say(f"could not clean up the throwaway {instance.service.name} ({exc})")


if __name__ == "__main__":
    sys.exit(main())
