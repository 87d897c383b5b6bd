"""Which process sent a request to a fake gateway, when the client sends no pid header.

Linux hands one ephemeral port to connections bound for different servers. A lookup
by the local port alone then names whichever process /proc lists first: once in CI it
named the test runner, and a test that SIGKILLs "the sender" took down its own pytest
worker. The lookup matches both ends of the connection.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from celery_agboss.testing.loopback import loopback_peer_pid
from tests.support.processes import wait_until

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the lookup reads Linux's /proc"
)

CHILD = """
import socket, sys
client = socket.socket()
client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
client.bind(("127.0.0.1", int(sys.argv[1])))
client.connect(("127.0.0.1", int(sys.argv[2])))
print("connected", flush=True)
sys.stdin.read()
"""


@contextmanager
def listening() -> Iterator[socket.socket]:
    server = socket.socket()
    try:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server
    finally:
        server.close()


def _shared_port_client(port: int) -> socket.socket:
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    client.bind(("127.0.0.1", port))
    return client


@pytest.fixture
def shared_port() -> Iterator[tuple[int, int, int, int]]:
    """A child connected to "the gateway" and this process to "the database", both from
    one local port: (that port, the gateway's, the database's, the child's pid)."""
    with ExitStack() as stack:
        gateway = stack.enter_context(listening())
        database = stack.enter_context(listening())
        ours = stack.enter_context(_shared_port_client(0))
        port = ours.getsockname()[1]
        child = stack.enter_context(
            subprocess.Popen(
                [sys.executable, "-c", CHILD, str(port), str(gateway.getsockname()[1])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        )
        stack.callback(child.kill)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"connected"
        ours.connect(database.getsockname())
        yield port, gateway.getsockname()[1], database.getsockname()[1], child.pid


def test_two_connections_on_one_local_port_each_name_their_own_process(
    shared_port: tuple[int, int, int, int],
) -> None:
    port, gateway, database, child = shared_port
    assert loopback_peer_pid(port, gateway) == child
    assert loopback_peer_pid(port, database) == os.getpid()


def test_the_local_port_alone_names_two_processes(shared_port: tuple[int, int, int, int]) -> None:
    """The twin: a lookup by the local port alone has two connections to choose from."""
    port = shared_port[0]

    def connected_from(port: int) -> int:
        with open("/proc/net/tcp") as table:
            next(table)
            rows = [line.split()[1:3] for line in table]
        connected = [local for local, remote in rows if remote != "00000000:0000"]
        return sum(1 for local in connected if local.endswith(f":{port:04X}"))

    wait_until(lambda: connected_from(port) >= 2, 5, message="two connections from the port")
