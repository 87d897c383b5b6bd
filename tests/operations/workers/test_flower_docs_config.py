"""Flower started from docs/flowerconfig.py, as docs/operators.md tells the on-call to.

The config file is used as shipped (not a copy): a real ``celery flower`` subprocess on
a Redis broker of the test's own. Without credentials in the environment it does not
start; with them it listens on 127.0.0.1 alone, and its pages and API answer only the
configured login; a headless Chromium (when installed) sees the login prompt, not the
tasks. Flower's ``/healthcheck`` and ``/metrics`` are its own unauthenticated pages.

Test-only flag: ``--port=N`` (a free port instead of the config's 5555, so runs never
collide); the config's address and credentials are what is tested.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

import pytest
import requests

from tests.conftest import ProcessFactory
from tests.operations.cli import celery_command
from tests.support.browser import chromium, headless_chromium
from tests.support.processes import ManagedProcess
from tests.support.services import in_ci
from tests.support.throwaway import free_ports

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[3]
DOCS_CONFIG = REPO_ROOT / "docs" / "flowerconfig.py"
START_SECONDS = 60.0
APP_SOURCE = """\
import os
from celery import Celery
app = Celery("docsflower", broker=os.environ["DOCS_FLOWER_BROKER"])
"""
PROTECTED = ("/", "/tasks", "/workers", "/tasks/datatable", "/api/tasks", "/api/workers")


def _start(
    managed_process: ProcessFactory, tmp_path: Path, redis_url: str, **env: str
) -> tuple[ManagedProcess, int]:
    (tmp_path / "docsflower.py").write_text(APP_SOURCE)
    (port,) = free_ports(1)
    process = managed_process(
        celery_command(
            "docsflower:app",
            "flower",
            f"--conf={DOCS_CONFIG}",
            f"--port={port}",
        ),
        name="flower-docs-config",
        env={
            "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}",
            "DOCS_FLOWER_BROKER": redis_url,
            # Neither may come from the shell that runs the tests.
            "FLOWER_BASIC_AUTH": "",
            "FLOWER_AUTH": "",
            **env,
        },
        cwd=str(tmp_path),
    )
    return process, port


def _listening_addresses(port: int) -> set[str]:
    """Every local address a socket LISTENs on at ``port`` (IPv4 and IPv6), from /proc."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, _, port_hex = fields[1].partition(":")
            if fields[3] == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.add(_address(address, width))
    return found


def _address(hex_address: str, width: int) -> str:
    raw = bytes.fromhex(hex_address)
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def _other_address() -> str | None:
    """An address of this host that is not loopback (the one a route outwards uses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent by a UDP connect
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.mark.parametrize(
    ("login", "says"),
    [
        ("", "no credentials"),
        ("oncall:change-me", "at least 12 characters"),
        ("oncall", "at least 12 characters"),
        (":a-long-enough-password", "at least 12 characters"),
    ],
    ids=["none", "short-password", "no-password", "no-user"],
)
def test_flower_from_the_docs_config_refuses_to_start_without_usable_credentials(
    managed_process: ProcessFactory, tmp_path: Path, redis_url: str, login: str, says: str
) -> None:
    process, port = _start(managed_process, tmp_path, redis_url, FLOWER_BASIC_AUTH=login)
    assert process.wait(START_SECONDS) != 0, process.describe()
    output = process.output()
    assert says in output and "Flower was not started" in output, output
    assert "change-me" not in output.replace("oncall:change-me", ""), "no password echoed"
    assert _listening_addresses(port) == set()


def test_flower_from_the_docs_config_answers_only_on_loopback_and_only_its_login(
    managed_process: ProcessFactory, tmp_path: Path, redis_url: str
) -> None:
    password = secrets.token_urlsafe(18)
    process, port = _start(
        managed_process,
        tmp_path,
        redis_url,
        FLOWER_BASIC_AUTH=f"oncall:{password}",
        FLOWER_UNAUTHENTICATED_API="true",  # ignored once a login is configured
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return requests.get(url + "/healthcheck", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    process.wait_until(answers, START_SECONDS, message="Flower to answer")
    assert _listening_addresses(port) == {"127.0.0.1"}
    other = _other_address()
    if other is not None:
        with pytest.raises(OSError), socket.create_connection((other, port), timeout=3):
            pass
    for path in PROTECTED:
        anonymous = requests.get(url + path, timeout=10)
        wrong = requests.get(url + path, auth=("oncall", password + "x"), timeout=10)
        assert (anonymous.status_code, wrong.status_code) == (401, 401), path
        if not path.startswith("/api/"):  # pages ask a browser for the login
            assert "Basic" in anonymous.headers.get("WWW-Authenticate", ""), path
    assert requests.get(url + "/tasks", auth=("oncall", password), timeout=10).status_code == 200
    workers = requests.get(url + "/api/workers", auth=("oncall", password), timeout=30)
    assert workers.status_code == 200, workers.text[:500]
    if chromium() is not None:
        assert "tasks-table" not in _dom(f"{url}/tasks"), "Chromium saw the tasks anonymously"
        assert "tasks-table" in _dom(f"http://oncall:{password}@127.0.0.1:{port}/tasks")


def test_chromium_is_installed_for_the_docs_config_check() -> None:
    """The test above loads the tasks page in a headless Chromium when it is there."""
    if chromium() is None:
        message = "chromium is not installed, so Flower's login is not tried in a browser"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def _dom(url: str) -> str:
    """The page as a headless Chromium renders it (its scripts get 5 s)."""
    return headless_chromium(url, "--dump-dom")
