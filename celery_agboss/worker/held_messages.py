"""A worker says which payment messages it holds unstarted, so its death does not hide them.

A worker's main process fetches more messages than its pool runs (Celery's prefetch),
and keeps ETA messages until they are due. Its executions are still ``REQUESTED``: no
delivery started them, so no lease says anything about them. When the whole worker is
SIGKILLed on Redis, those messages stay among the unacked for the visibility timeout
(an hour by default); only the sweep's ``agboss_requested_grace`` (5 minutes) would
bring them back. RabbitMQ gives them back at once.

So each worker's main process writes, from a daemon thread, the execution ids of the
``PaymentTask`` messages it holds and has not started (``store.held_messages``), every
third of a lease TTL while there are any (the row's time is the heartbeat).
The sweep re-publishes an execution listed by a worker whose row is older than a lease
TTL — it stopped writing: killed, or frozen that long — at once instead of after the
grace, unless a live worker lists it too (that one has the message already).

Why that is safe: it is the re-publish the grace would have made, only earlier, and
only for executions still ``REQUESTED`` (a compare-and-set under the row's lock).
RabbitMQ gives a dead consumer's messages back by itself: workers on it write no row. If
the worker was only frozen and runs its copy after all, the two deliveries meet at the
execution's lease, like any redelivered message (design: trap 2): one runs, the other is
deferred or replays. The cost of a wrong guess is a duplicate message and one count
toward ``agboss_max_recovery_attempts``, never a second payment. A worker that stops
warmly gives its unstarted messages back to the broker and deletes its row first.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from celery import signals as celery_signals
from celery.worker import state as worker_state

from celery_agboss.core import sabotage
from celery_agboss.core.protections import HELD_NOT_REPORTED
from celery_agboss.errors import StoreError
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.broker_transport import AMQP, driver_type
from celery_agboss.store.held_messages import forget_held, write_held
from celery_agboss.task import PaymentTask

logger = logging.getLogger("celery_agboss")

JOIN_SECONDS = 5.0


def _requests(*sets: Any) -> list[Any]:
    """The requests in Celery's WeakSets, read from another thread (retried when the
    event loop changed one meanwhile)."""
    for _ in range(5):
        try:
            return [request for found in sets for request in list(found)]
        except RuntimeError:  # "set changed size during iteration"
            continue
    return []


class HeldMessages:
    """The daemon thread of one worker's main process (see the module docstring)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.worker = uuid.uuid4().hex
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="agboss-held-messages", daemon=True)
        self._written: frozenset[str] = frozenset()

    def held(self) -> frozenset[str]:
        """Ids of this app's PaymentTask messages the worker holds and has not started."""
        tasks = getattr(self.runtime.app, "_tasks", None) or {}
        active = {request.id for request in _requests(worker_state.active_requests)}
        return frozenset(
            str(request.id)
            for request in _requests(
                worker_state.reserved_requests, worker_state.scheduled_requests
            )
            if request.id not in active
            and isinstance(tasks.get(getattr(request, "task_name", None)), PaymentTask)
        )

    def _run(self) -> None:
        """Every third of a lease TTL: the held ids (the heartbeat) while there are any,
        one delete when there are none left. One statement per worker per tick at
        most, as for the lease renewals; a message fetched and killed within one tick
        is left to the grace."""
        heartbeat = self.runtime.settings.lease_ttl_seconds / 3
        while not self.stop.wait(heartbeat):
            held = self.held()
            if (not held and not self._written) or sabotage.active(HELD_NOT_REPORTED):
                continue
            try:
                if held:
                    write_held(self.runtime.store, self.worker, sorted(held))
                else:
                    forget_held(self.runtime.store, self.worker)
            except (Exception, StoreError):
                logger.debug("could not write the held messages", exc_info=True)
                continue
            self._written = held
        self._forget()

    def _forget(self) -> None:
        """The row goes after the thread's last write, by the thread itself: deleted from
        ``close`` while a slow write was still under way, it came back when that write
        landed, and one TTL later the sweep re-published messages the broker already
        had back (a duplicate each, a count toward the recovery cap)."""
        if not self._written:
            return
        try:
            forget_held(self.runtime.store, self.worker)
        except (Exception, StoreError):
            logger.debug("could not forget the held messages", exc_info=True)

    def close(self) -> None:
        """Warm stop: the worker gives its unstarted messages back to the broker; the
        thread deletes its row once its last write is done (a write that outlives the
        wait leaves the row to go stale, as a killed worker's does)."""
        self.stop.set()
        self.thread.join(JOIN_SECONDS)


def _gives_back_at_once(app: Any) -> bool:
    """RabbitMQ (AMQP) requeues a consumer's unacked messages as soon as its connection
    closes (a killed worker's at once, a frozen one's after the heartbeat timeout): no
    row is needed there, and none is written."""
    return driver_type(app.conf) == AMQP


def install(runtime: Runtime) -> None:
    """Called by ``AGBoss(app)``: this app's workers say what they hold."""
    app = runtime.app
    running: list[HeldMessages] = []

    def on_worker_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app or running or _gives_back_at_once(app):
            return
        held = HeldMessages(runtime)
        running.append(held)
        held.thread.start()

    def on_worker_shutdown(**_: Any) -> None:
        for held in running:
            held.close()

    runtime.listen(celery_signals.worker_ready, on_worker_ready)
    runtime.listen(celery_signals.worker_shutdown, on_worker_shutdown)


__all__ = ["HeldMessages", "install"]
