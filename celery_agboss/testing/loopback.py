"""Two things of a loopback test server: who is on the other end, and quiet on a kill.

A test kills a client mid-request on purpose; a fake gateway must say which local
process sent a request even when an official SDK sends no header saying so.
"""

from __future__ import annotations

import os
import sys
from http.server import ThreadingHTTPServer
from typing import Any


class QuietServer(ThreadingHTTPServer):
    """A client killed mid-request (what the tests do) is not an error of the server."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def loopback_peer_pid(client_port: int, server_port: int) -> int | None:
    """The pid of the local process holding the client end of the TCP connection from
    ``client_port`` to ``server_port`` (Linux).

    Both ports are matched: Linux hands the same ephemeral port to connections bound for
    different servers, so a socket whose local port alone matches may be another
    process's connection to the database or the broker, and signalling that process
    would hit a bystander (the test runner itself, once).
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines, None)
                for line in lines:
                    fields = line.split()
                    if (
                        len(fields) > 9
                        and _port(fields[1]) == client_port
                        and _port(fields[2]) == server_port
                    ):
                        inodes.add(f"socket:[{fields[9]}]")
        except OSError:
            continue
    if not inodes:
        return None
    with os.scandir("/proc") as processes:
        for entry in processes:
            if entry.name.isdigit() and _holds_any(entry.name, inodes):
                return int(entry.name)
    return None


def _port(address: str) -> int:
    """The port of a /proc/net/tcp address (``0100007F:1F90``: hex address, hex port)."""
    return int(address.rsplit(":", 1)[1], 16)


def _holds_any(pid: str, inodes: set[str]) -> bool:
    """Whether process ``pid`` has one of the sockets open (closing its fd listing even
    when it answers early: a leaked iterator is a ResourceWarning in the caller's test)."""
    try:
        with os.scandir(f"/proc/{pid}/fd") as fds:
            return any(_link(fd.path) in inodes for fd in fds)
    except OSError:
        return False


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:  # the fd closed meanwhile
        return None
