"""``python -m tests.support.throwaway -- COMMAND``: throwaway servers for the services
that do not answer, and nothing left of them once COMMAND is done.

Each test runs the real wrapper in a subprocess with one service's variable pointed
at a free port, so only that service gets a throwaway instance; the command it runs
reports what it saw as JSON on its stdout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import services, throwaway
from tests.support.processes import wait_until
from tests.support.throwaway import (
    COMPOSE_COMMAND,
    PostgresThrowaway,
    RabbitmqThrowaway,
    RedisThrowaway,
    Throwaway,
    Unavailable,
)

ROOT = Path(__file__).resolve().parents[2]
WRAPPER_SECONDS = 240.0
DIR_PATTERN = re.compile(r"in (/\S*agboss-throwaway-\S+?)\)")


def free_port() -> int:
    return throwaway.free_ports(1)[0]


def closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


def wrapper(*command: str, only: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "tests.support.throwaway"]
    if only is not None:
        argv += ["--only", only]
    return [*argv, "--", *command]


def run_wrapper(
    command: list[str], env: dict[str, str], seconds: float = WRAPPER_SECONDS
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=seconds,
        check=False,
    )


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def needs(kind: type[Throwaway]) -> None:
    try:
        kind.locate()
    except Unavailable as exc:
        pytest.skip(f"no throwaway {kind.service.name} here: {exc}")


def unanswering_env(kind: type[Throwaway], unused_url_env: dict[str, str]) -> dict[str, str]:
    """Skips where no throwaway ``kind`` can start; else an environment that points only
    its service at a port nothing uses."""
    needs(kind)
    var = kind.service.env_var
    return {var: unused_url_env[var]}


def started_dir(stderr: str) -> Path:
    found = DIR_PATTERN.search(stderr)
    assert found, stderr
    return Path(found.group(1))


def run_child_on_throwaway(
    kind: type[Throwaway], env: dict[str, str], child: str, seconds: float = WRAPPER_SECONDS
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], int]:
    """Runs ``child`` under the wrapper for ``kind``'s service alone and insists it
    succeeded: its run, the JSON it printed, and the port of the URL it was handed (the
    throwaway's, which ``assert_nothing_left`` checks is closed afterwards)."""
    done = run_wrapper(wrapper(*python(child), only=kind.slug), env, seconds)
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout)
    return done, seen, services.host_and_port(seen["url"], kind.service.default_port)[1]


def assert_nothing_left(directory: Path, port: int) -> None:
    assert not directory.exists(), directory
    assert throwaway.marked_pids(directory) == []
    assert closed(port), f"port {port} still answers"


@pytest.fixture
def unused_url_env() -> Iterator[dict[str, str]]:
    """The environment that points each service's variable at a port nothing uses."""
    yield {
        services.POSTGRES.env_var: f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test",
        services.REDIS.env_var: f"redis://127.0.0.1:{free_port()}",
        services.RABBITMQ.env_var: f"amqp://guest:guest@127.0.0.1:{free_port()}//",
    }


# --- nothing to do -------------------------------------------------------------------


def test_with_every_service_answering_it_starts_nothing_and_passes_the_exit_code_on() -> None:
    for service in services.SERVICES:
        services.require(service)
    done = run_wrapper(wrapper(*python("import sys; sys.exit(3)")), {}, seconds=60)
    assert done.returncode == 3, done.stderr
    assert "throwaway" not in done.stderr, done.stderr


# --- one throwaway service at a time --------------------------------------------------


def test_an_unanswering_redis_gets_a_throwaway_server_the_command_can_use(
    unused_url_env: dict[str, str],
) -> None:
    env = unanswering_env(RedisThrowaway, unused_url_env)
    child = """
        import json, os, redis
        url = os.environ["AGBOSS_TEST_REDIS_URL"]
        client = redis.Redis.from_url(url + "/15", socket_timeout=5)
        print(json.dumps({"url": url, "ping": client.ping()}))
    """
    done, seen, port = run_child_on_throwaway(RedisThrowaway, env, child, seconds=60)
    assert seen["ping"] is True
    assert seen["url"] != env[services.REDIS.env_var]
    assert f"Redis was not answering at {env[services.REDIS.env_var]}" in done.stderr
    assert f"on 127.0.0.1:{port}" in done.stderr
    assert_nothing_left(started_dir(done.stderr), port)


def test_an_unanswering_postgresql_gets_a_throwaway_cluster_with_database_test(
    unused_url_env: dict[str, str],
) -> None:
    env = unanswering_env(PostgresThrowaway, unused_url_env)
    child = """
        import json, os, psycopg
        from tests.support.services import libpq_url
        url = os.environ["AGBOSS_TEST_POSTGRES_URL"]
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            one = conn.execute("SELECT 1").fetchone()[0]
            database = conn.execute("SELECT current_database()").fetchone()[0]
            superuser = conn.execute(
                "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
            ).fetchone()[0]
        print(json.dumps({"url": url, "one": one, "db": database, "super": superuser}))
    """
    started = time.monotonic()
    done, seen, port = run_child_on_throwaway(PostgresThrowaway, env, child)
    elapsed = time.monotonic() - started
    assert (seen["one"], seen["db"], seen["super"]) == (1, "test", True)
    assert "PostgreSQL was not answering at" in done.stderr and "initdb in" in done.stderr
    assert_nothing_left(started_dir(done.stderr), port)
    assert elapsed < 60, f"the throwaway PostgreSQL took {elapsed:.1f}s"


@pytest.mark.slow
def test_an_unanswering_rabbitmq_gets_a_throwaway_node_rabbitmqctl_reaches(
    unused_url_env: dict[str, str],
) -> None:
    """About 15 s here (the node's boot): the deployment tests make a vhost of their
    own with ``rabbitmqctl``, so the command must reach the node that way too."""
    env = unanswering_env(RabbitmqThrowaway, unused_url_env)
    child = """
        import json, os
        from kombu.connection import Connection
        from tests.deployment.brokers import rabbitmq_vhost
        url = os.environ["AGBOSS_TEST_RABBITMQ_URL"]
        with rabbitmq_vhost(url) as vhost_url:
            with Connection(vhost_url, connect_timeout=10) as conn:
                conn.ensure_connection(max_retries=1)
                connected = conn.connected
        print(json.dumps({"url": url, "vhost": vhost_url, "connected": connected}))
    """
    done, seen, port = run_child_on_throwaway(RabbitmqThrowaway, env, child)
    assert seen["connected"] is True
    assert "RabbitMQ was not answering at" in done.stderr
    assert "node agboss-throwaway-" in done.stderr
    assert_nothing_left(started_dir(done.stderr), port)


# --- no server installed --------------------------------------------------------------


def test_without_redis_server_on_path_it_names_the_variable_and_the_compose_command(
    unused_url_env: dict[str, str], tmp_path: Path
) -> None:
    url = unused_url_env[services.REDIS.env_var]
    env = {services.REDIS.env_var: url, "PATH": str(tmp_path)}
    child = python("import os; print(os.environ['AGBOSS_TEST_REDIS_URL'])")
    done = run_wrapper(wrapper(*child, only="redis"), env, seconds=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == url  # left as it was: the tests that need it skip
    (line,) = done.stderr.strip().splitlines()
    assert "redis-server is not installed" in line
    assert "set AGBOSS_TEST_REDIS_URL" in line and COMPOSE_COMMAND in line


@pytest.mark.parametrize("kind", throwaway.THROWAWAYS, ids=lambda kind: kind.slug)
def test_each_service_without_its_server_names_its_own_variable(
    kind: type[Throwaway],
    unused_url_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    def missing() -> None:
        raise Unavailable(f"{kind.program} is not installed")

    monkeypatch.setattr(kind, "locate", staticmethod(missing))
    monkeypatch.setenv(kind.service.env_var, unused_url_env[kind.service.env_var])
    code = throwaway.main(["--only", kind.slug, "--", *python("import sys; sys.exit(7)")])
    assert code == 7
    err = capfd.readouterr().err
    assert f"set {kind.service.env_var} to one" in err and COMPOSE_COMMAND in err, err


def test_a_server_that_exits_at_start_is_named_and_leaves_nothing(
    unused_url_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    needs(RedisThrowaway)
    original = RedisThrowaway.command

    def refused(self: RedisThrowaway) -> list[str]:
        return [*original(self), "--no-such-option", "x"]

    monkeypatch.setattr(RedisThrowaway, "command", refused)
    monkeypatch.setenv(services.REDIS.env_var, unused_url_env[services.REDIS.env_var])
    code = throwaway.main(["--only", "redis", "--", *python("import sys; sys.exit(0)")])
    assert code == 0
    err = capfd.readouterr().err
    assert "a throwaway Redis did not start (redis-server exited with 1" in err, err
    assert "set AGBOSS_TEST_REDIS_URL to one" in err and COMPOSE_COMMAND in err, err
    mine = f"{throwaway.DIR_PREFIX}{os.getpid()}-"
    assert not list(Path(tempfile.gettempdir()).glob(f"{mine}*"))


def test_the_compose_command_starts_the_compose_files_service_names() -> None:
    assert COMPOSE_COMMAND == (
        "docker compose -f docker/compose.yaml --profile test up -d postgres redis rabbitmq"
    )


# --- signals and leftovers ------------------------------------------------------------


def test_sigterm_to_the_wrapper_ends_the_command_and_the_throwaway_server(
    unused_url_env: dict[str, str], tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    env = unanswering_env(RedisThrowaway, unused_url_env)
    child = f"""
        import os, pathlib, time
        pathlib.Path({str(ready)!r}).write_text(os.environ["AGBOSS_TEST_REDIS_URL"])
        time.sleep(120)
    """
    proc = subprocess.Popen(
        wrapper(*python(child), only="redis"),
        env={**os.environ, **env},
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # Its content, not only the file: exists() is true before write_text has written,
        # and an empty URL reads as the default port, the real Redis's.
        url = wait_until(
            lambda: ready.exists() and ready.read_text(), timeout=60, message="the command's URL"
        )
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert_nothing_left(started_dir(stderr), services.host_and_port(url, 6379)[1])


def test_the_leftovers_of_a_killed_wrapper_are_swept_on_the_next_run(tmp_path: Path) -> None:
    if not Path("/proc").is_dir():
        pytest.skip("finds processes through /proc")
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    directory = Path(tempfile.mkdtemp(prefix=f"{throwaway.DIR_PREFIX}{gone.pid}-redis-"))
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"],
        env={**os.environ, throwaway.MARKER_ENV: str(directory)},
        start_new_session=True,
    )
    try:
        wait_until(lambda: throwaway.marked_pids(directory), timeout=30)
        assert directory in throwaway.sweep_stale()
        assert sleeper.wait(timeout=30) == -signal.SIGKILL
        assert not directory.exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


# --- arguments ------------------------------------------------------------------------


def test_without_a_command_it_refuses_to_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        throwaway.parse_args(["--"])
    assert exited.value.code == 2
    assert "no COMMAND" in capsys.readouterr().err


def test_only_refuses_a_service_it_does_not_know(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        throwaway.parse_args(["--only", "mysql", "--", "true"])
    assert "unknown mysql" in capsys.readouterr().err
