"""Throwing the planned faults, one at a time, at the processes and the gateway.

A fault that must catch a charge first (``*-after-charge``) holds the gateway's answer
to the next charge and waits for one to arrive (bounded); the next fault waits until
it is done, so two never fight over one process. Freezes are thawed, stopped and
killed workers restarted, on the explorer's tick. A fault that finds nothing to hit in
time (no charge arrived, no eligible worker) is skipped and counted as skipped.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from celery_agboss.chaos.schedule import Fault, FaultKind
from celery_agboss.chaos.supervisor import Managed, Supervisor
from celery_agboss.testing.gateway_server import FakeGatewayServer, HeldAnswer
from celery_agboss.testing.gateway_types import FakeGatewayFault

CATCH_SECONDS = 15.0  # how long an *-after-charge fault waits for a charge to hold
SIGTERM_SECONDS = 30.0  # warm shutdown's bound before the worker is SIGKILLed
HOLD_SECONDS = 60.0

_GATEWAY_FAULTS = {
    FaultKind.ANSWER_THEN_DROP: FakeGatewayFault.ANSWER_THEN_DROP,
    FaultKind.FAIL_BEFORE_PROCESSING: FakeGatewayFault.FAIL_BEFORE_PROCESSING,
    FaultKind.SLOW: FakeGatewayFault.SLOW,
}

Say = Callable[[str], None]


@dataclass
class _Catching:
    fault: Fault
    held: HeldAnswer
    deadline: float


@dataclass
class _Thaw:
    at: float
    pid: int  # a child, or a worker's main process (then its whole group)
    group: Managed | None


@dataclass
class _Stopping:
    number: int
    process: Managed
    deadline: float


class FaultRunner:
    """Fires faults and looks after what they leave behind (freezes, dead workers)."""

    def __init__(
        self,
        supervisor: Supervisor,
        server: FakeGatewayServer,
        lease_ttl: float,
        say: Say,
    ) -> None:
        self.supervisor = supervisor
        self.server = server
        self.lease_ttl = lease_ttl
        self.say = say
        self.injected: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self._catching: _Catching | None = None
        self._thaws: list[_Thaw] = []
        self._stopping: list[_Stopping] = []
        self._frozen: set[int] = set()
        self._restart: set[int] = set()
        self._armed: Counter[FaultKind] = Counter()

    # --- state -----------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A fault is still catching its charge: the next one waits."""
        return self._catching is not None

    @property
    def settled(self) -> bool:
        """Nothing frozen, stopping or waiting for a restart."""
        return not (self._catching or self._thaws or self._stopping or self._restart)

    def _eligible(self, start: int) -> tuple[int, Managed] | None:
        """The planned worker, else the next one, that is up, ready and not frozen."""
        workers = self.supervisor.workers
        count = len(workers)
        stopping = {s.number for s in self._stopping}
        for step in range(count):
            number = (start + step) % count
            process = workers.get(number)
            if (
                process is None
                or number in stopping
                or number in self._restart
                or not self.supervisor.ready(process)
            ):
                continue
            members = set(process.children()) | {process.pid}
            if members & self._frozen:
                continue
            return number, process
        return None

    # --- firing ------------------------------------------------------------------------------

    def fire(self, fault: Fault, now: float) -> None:
        kind = fault.kind
        if kind in _GATEWAY_FAULTS:
            delay = fault.seconds if kind is FaultKind.SLOW else None
            self.server.gateway.inject_fault(
                _GATEWAY_FAULTS[kind], operation="charge", times=1, delay=delay
            )
            self._armed[kind] += 1
            self.say(
                f"fault {fault.number} {kind.value}: armed for the next charge"
                + (f" ({delay} s)" if delay else "")
            )
            return
        if kind in (FaultKind.KILL_CHILD_AFTER_CHARGE, FaultKind.FREEZE_CHILD_AFTER_CHARGE):
            held = self.server.hold_next_answer(timeout=HOLD_SECONDS)
            self._catching = _Catching(fault, held, now + CATCH_SECONDS)
            return
        target = self._eligible(fault.worker)
        if target is None:
            self._skip(fault, "no worker ready")
            return
        number, process = target
        name = f"chaos{number + 1} (pid {process.pid})"
        if kind is FaultKind.KILL_CHILD:
            children = process.children()
            if not children:
                self._skip(fault, f"{name} has no pool child")
                return
            child = children[int(fault.pick * len(children))]
            if self.supervisor.signal_pid(child, signal.SIGKILL):
                self._count(fault, f"SIGKILL pool child {child} of {name}")
            else:
                self._skip(fault, f"pool child {child} of {name} was gone")
        elif kind is FaultKind.KILL_WORKER:
            self.supervisor.signal_group(process, signal.SIGKILL)
            self._stopping.append(_Stopping(number, process, now + SIGTERM_SECONDS))
            self._count(fault, f"SIGKILL {name} and its pool")
        elif kind is FaultKind.SIGTERM_WORKER:
            self.supervisor.signal_pid(process.pid, signal.SIGTERM)
            self._stopping.append(_Stopping(number, process, now + SIGTERM_SECONDS))
            self._count(fault, f"SIGTERM {name} (warm shutdown)")
        elif kind is FaultKind.FREEZE_WORKER:
            self.supervisor.signal_group(process, signal.SIGSTOP)
            thaw = now + self.lease_ttl + fault.seconds
            self._frozen.add(process.pid)
            self._thaws.append(_Thaw(thaw, process.pid, process))
            self._count(fault, f"SIGSTOP {name} and its pool for {thaw - now:.1f} s")
        else:  # pragma: no cover - every kind is handled above
            raise AssertionError(kind)

    def _count(self, fault: Fault, what: str) -> None:
        self.injected[fault.kind.value] += 1
        self.say(f"fault {fault.number} {fault.kind.value}: {what}")

    def _skip(self, fault: Fault, why: str) -> None:
        self.skipped[fault.kind.value] += 1
        self.say(f"fault {fault.number} {fault.kind.value}: skipped, {why}")

    # --- the tick ----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        self._tick_catching(now)
        for thaw in [t for t in self._thaws if t.at <= now]:
            self._thaws.remove(thaw)
            self._frozen.discard(thaw.pid)
            self._continue(thaw)
            self.say(f"SIGCONT {thaw.pid}")
        for stopping in list(self._stopping):
            if not stopping.process.running:
                self._stopping.remove(stopping)
                self._restart.add(stopping.number)
            elif now >= stopping.deadline:
                self.say(f"chaos{stopping.number + 1} did not stop in time: SIGKILL")
                self.supervisor.signal_group(stopping.process, signal.SIGKILL)
                stopping.deadline = now + SIGTERM_SECONDS
        for number in sorted(self._restart):
            self._restart.discard(number)
            worker = self.supervisor.start_worker(number)
            self.say(f"chaos{number + 1} restarted (pid {worker.pid})")
        self.revive(now)

    def revive(self, now: float) -> None:
        """A worker that died without a fault of ours (it should not): restart it."""
        stopping = {s.number for s in self._stopping}
        for number, process in list(self.supervisor.workers.items()):
            if not process.running and number not in stopping and number not in self._restart:
                self.say(
                    f"chaos{number + 1} (pid {process.pid}) exited by itself "
                    f"({process.popen.returncode}); restarted. Its log: {process.log_path}"
                )
                self.supervisor.start_worker(number)

    def _tick_catching(self, now: float) -> None:
        catching = self._catching
        if catching is None:
            return
        fault, held = catching.fault, catching.held
        if not held.reached:
            if now >= catching.deadline:
                self._catching = None
                self.server.cancel_hold(held)
                self._skip(fault, "no charge arrived to catch")
            return
        self._catching = None
        pid = held.pid
        owner = None if pid is None else self.supervisor.ours(pid)
        if pid is None or owner is None or owner.pid == pid:
            held.release()
            self._skip(fault, f"the charge came from pid {pid}, not a pool child of ours")
            return
        order = held.reference
        if fault.kind is FaultKind.KILL_CHILD_AFTER_CHARGE:
            self.supervisor.signal_pid(pid, signal.SIGKILL)
            held.release()
            self._count(fault, f"SIGKILL pool child {pid} after the gateway charged {order}")
        else:
            self.supervisor.signal_pid(pid, signal.SIGSTOP)
            held.release()  # the answer waits in the frozen process's socket
            seconds = self.lease_ttl + fault.seconds
            self._frozen.add(pid)
            self._thaws.append(_Thaw(now + seconds, pid, None))
            self._count(
                fault, f"SIGSTOP pool child {pid} for {seconds:.1f} s after charging {order}"
            )

    def disarm_gateway(self) -> None:
        """Count the gateway faults some charge met as injected, the others as skipped,
        and disarm those: the quiet phase has no faults."""
        self.server.gateway.clear_faults()
        met = Counter(r.fault for r in self.server.gateway.requests if r.fault is not None)
        for kind, armed in self._armed.items():
            used = min(armed, met[_GATEWAY_FAULTS[kind]])
            if used:
                self.injected[kind.value] += used
            if armed > used:
                self.skipped[kind.value] += armed - used
        self._armed.clear()

    def finish(self) -> None:
        """Thaw everything now (the run is ending)."""
        if self._catching is not None:
            self.server.cancel_hold(self._catching.held)
            self._catching.held.release()
            self._catching = None
        for thaw in self._thaws:
            self._continue(thaw)
        self._thaws.clear()
        self._frozen.clear()

    def _continue(self, thaw: _Thaw) -> None:
        if thaw.group is not None:
            self.supervisor.signal_group(thaw.group, signal.SIGCONT)
        else:
            self.supervisor.signal_pid(thaw.pid, signal.SIGCONT)


__all__ = ["FaultRunner"]
