"""Where a round's CPU went, by process kind, read from ``/proc`` around the round.

The end-to-end ratio says how much slower a protected task is; on two cores shared by
everything, the reason is whose CPU each task costs. Every process's ``utime + stime``
is read before and after a round and the difference summed by kind: the worker's
main process and its pool children, the benchmark process (the publisher), the
PostgreSQL server's processes, Redis and the fake gateway. Processes that started or
ended during the round count from zero or are missed (none should: the workers and
their children start before the warm-up). Linux only; elsewhere nothing is measured.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bench.processes import live_pids, stat_fields

KINDS = ("worker child", "worker main", "publisher", "postgres", "redis", "gateway")
"""In the order the table prints them; anything else is ``other``."""


@dataclass(frozen=True)
class ProcessCpu:
    command: str
    seconds: float


def cpu_snapshot() -> dict[int, ProcessCpu]:
    """Every readable process's CPU seconds so far (user + system), by pid."""
    if not os.path.isdir("/proc"):
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, ProcessCpu] = {}
    for pid in live_pids():
        fields = stat_fields(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields is not None and len(fields) > 12:
            found[pid] = ProcessCpu(command, (int(fields[11]) + int(fields[12])) / tick)
    return found


def kind_of(pid: int, command: str, *, workers: Mapping[int, set[int]], gateway: int) -> str:
    """The kind of a process: ``workers`` maps each worker's main pid to its group's pids."""
    if pid == os.getpid():
        return "publisher"
    for main, group in workers.items():
        if pid == main:
            return "worker main"
        if pid in group:
            return "worker child"
    if pid == gateway:
        return "gateway"
    if command.startswith("postgres"):
        return "postgres"
    if "redis-server" in command:
        return "redis"
    return "other"


def cpu_spent(
    before: Mapping[int, ProcessCpu],
    after: Mapping[int, ProcessCpu],
    kind: Callable[[int, str], str],
) -> dict[str, float]:
    """CPU seconds spent between two snapshots, summed by ``kind(pid, command)``."""
    spent: dict[str, float] = {}
    for pid, now in after.items():
        earlier = before.get(pid)
        start = earlier.seconds if earlier is not None and earlier.command == now.command else 0.0
        name = kind(pid, now.command)
        spent[name] = spent.get(name, 0.0) + max(now.seconds - start, 0.0)
    return spent


__all__ = ["KINDS", "ProcessCpu", "cpu_snapshot", "cpu_spent", "kind_of"]
