"""The engine's ``ExecutionContext`` as a Celery delivery needs it: a wait that was
interrupted is not a send that overran.

Celery can raise into the body while a send is on the wire: a soft time limit, or
``revoke(terminate=True, signal="SIGUSR1")`` (``SoftTimeLimitExceeded`` in a prefork
child), a cold shutdown's ``SystemExit``. The send itself goes on in its thread and
may still reach the gateway until its ``attempt_timeout`` bound. Had the holder
stopped renewing right then, its lease would expire while the send may still be
charging, and a take-over could look it up (find nothing yet) and send again (R18,
R23). So an interrupted send keeps the lease renewed until it ends or its bound
passes; only then are renewals stopped (R22), and the lease is never released under
it (``ExecutionContext.may_release``). The delivery itself trusts its lease no more:
it writes and sends nothing after the interruption (its own attempt is still
pending, and only a later holder may reconcile it), exactly as after an overrun.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from celery_agboss.core.execution import ExecutionContext
from celery_agboss.core.inflight import BoundedRun
from celery_agboss.core.lease import LeaseRenewer
from celery_agboss.core.store import FencedTransaction
from celery_agboss.errors import ExecutionFencedError


class DeliveryContext(ExecutionContext):
    """``ExecutionContext`` whose interrupted sends keep the lease until they settle."""

    def __init__(self, *args: Any, renewer: LeaseRenewer | None = None, **kwargs: Any) -> None:
        super().__init__(*args, renewer=renewer, **kwargs)
        self._delivery_renewer = renewer
        self._sends_lock = threading.Lock()
        self._sends: list[BoundedRun] = []
        self._interrupted: str | None = None

    def send_started(self, run: BoundedRun) -> None:
        super().send_started(run)
        with self._sends_lock:
            self._sends = [r for r in self._sends if not r.done.is_set()] + [run]

    def running_sends(self) -> list[BoundedRun]:
        """This delivery's sends that may still reach the gateway."""
        with self._sends_lock:
            return [run for run in self._sends if not run.done.is_set()]

    def send_overran(self, run: BoundedRun) -> None:
        """Past its bound: stop renewing (the engine's rule). Interrupted before it: keep
        renewing; if it passes its bound still running, stop then."""
        if run.done.is_set() or time.monotonic() >= run.deadline:
            super().send_overran(run)
            return
        self._interrupted = f"the wait for {run.name} was interrupted while it was sending"
        self._after(run_list=[run], stop_when_settled=False)

    # --- no write or send of this delivery after an interrupted send ---------------------

    def _refuse_if_interrupted(self) -> None:
        reason = self._interrupted
        if reason is not None:
            ref = self.lease_ref
            raise ExecutionFencedError(
                f"lease {ref.scope!r} (token {ref.token}) is no longer trusted by this "
                f"delivery: {reason}",
                scope=ref.scope,
                holder=ref.holder,
                token=ref.token,
            )

    def assert_can_send(self) -> None:
        self._refuse_if_interrupted()
        super().assert_can_send()

    def assert_held(self) -> None:
        self._refuse_if_interrupted()
        super().assert_held()

    @contextmanager
    def fenced(self) -> Iterator[FencedTransaction]:
        self._refuse_if_interrupted()
        with super().fenced() as tx:
            yield tx

    def stop_renewing_when_settled(self, reason: str) -> None:
        """The delivery ends without a verdict: its lease is left to expire (never
        released), but not before the sends under it ended or passed their bound."""
        running = self.running_sends()
        if running:
            self._after(run_list=running, stop_when_settled=True, reason=reason)
        else:
            self._stop_renewing(reason)

    def _after(
        self,
        *,
        run_list: Sequence[BoundedRun],
        stop_when_settled: bool,
        reason: str = "the delivery stopped without a verdict",
    ) -> None:
        def watch() -> None:
            for run in run_list:
                remaining = run.deadline - time.monotonic()
                if remaining > 0:
                    run.done.wait(remaining)
            stuck = [run for run in run_list if not run.done.is_set()]
            for run in stuck:
                super(DeliveryContext, self).send_overran(run)
            if stop_when_settled and not stuck:
                self._stop_renewing(reason)

        threading.Thread(target=watch, name="agboss-send-watch", daemon=True).start()

    def _stop_renewing(self, reason: str) -> None:
        lease = self.lease
        lease.mark_lost(reason)
        if self._delivery_renewer is not None:
            self._delivery_renewer.untrack(lease)


__all__ = ["DeliveryContext"]
