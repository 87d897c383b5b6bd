"""A throwaway Celery app with celery_agboss on it, and an in-process worker for it.

What the ``agboss_app`` and ``agboss_worker`` fixtures are made of, usable without
pytest too::

    app = make_test_app(sqlite_store_url(tmp), clock=clock)
    with running_worker(app):
        charge_order.delay(42).get(timeout=10)
    close_test_app(app)

The broker is kombu's in-memory transport and results go to Celery's in-memory
cache, both shared by everything in this process; so every app gets a queue of its
own (a message left over from one test never reaches another test's worker) and the
queue is deleted when the app is closed.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from celery import Celery
from celery import _state as celery_state
from celery import signals as celery_signals
from celery.contrib.testing.worker import start_worker
from celery.worker import state as worker_state

from celery_agboss import signals as agboss_signals
from celery_agboss.app import AGBoss
from celery_agboss.runtime.settings import TESTING_PSEUDONYM_KEY

TEST_LEASE_TTL_SECONDS = 5.0
"""Short, so a test that loses a lease waits seconds, not the default 30 s."""
TEST_RETRY_DELAY_SECONDS = 0.2
"""The retry after an unknown outcome comes at once: the test sees it reconciled."""

WAKE_INTERVAL_SECONDS = 0.02

_counter = itertools.count(1)


class _ThrowawayCelery(Celery):  # type: ignore[misc]  # celery has no type information
    """Tasks declared on it are its own (``shared=False`` unless said otherwise).

    A shared task is added to every app finalized later in the process: a test's task,
    closing over that test's gateway, would turn up in the next test's app.
    """

    def task(self, *args: Any, **opts: Any) -> Any:
        opts.setdefault("shared", False)
        return super().task(*args, **opts)


def throwaway_app_config(database_url: str, queue: str) -> dict[str, Any]:
    """The settings ``make_test_app`` starts from (``config=`` overrides any of them)."""
    return {
        "broker_url": "memory://",
        "result_backend": "cache+memory://",
        # The memory transport polls; a second between polls would slow every test.
        "broker_transport_options": {"polling_interval": 0.02},
        "broker_connection_retry_on_startup": True,
        "task_default_queue": queue,
        "worker_prefetch_multiplier": 1,
        # Leave the root logger to pytest (its log capture lives there).
        "worker_hijack_root_logger": False,
        "agboss_database_url": database_url,
        # The fixed key the AGBOSS_TESTING switch would give, without touching os.environ.
        "agboss_pseudonym_key": TESTING_PSEUDONYM_KEY,
        "agboss_lease_ttl": TEST_LEASE_TTL_SECONDS,
        "agboss_retry_delay": TEST_RETRY_DELAY_SECONDS,
        "agboss_sweep_interval": 0,
    }


def make_test_app(
    database_url: str,
    *,
    clock_offset_source: Callable[[], int] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Celery:
    """A Celery app bound to ``AGBoss`` on ``database_url`` (already migrated).

    ``clock_offset_source`` (e.g. ``VirtualClock.offset_ms``) moves the store's
    database clock; it must be set before the store opens, so it is set here.
    """
    number = next(_counter)
    queue = f"agboss-test-{os.getpid()}-{number}"
    app = _ThrowawayCelery(f"agboss_test_{number}", set_as_current=False)
    app.conf.update({**throwaway_app_config(database_url, queue), **dict(config or {})})
    runtime = AGBoss(app)
    runtime.clock_offset_source = clock_offset_source
    return app


_UNSET = object()


@contextmanager
def bound_app(
    app: Celery,
    database_url: str,
    *,
    clock_offset_source: Callable[[], int] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Iterator[Celery]:
    """The application's own app, its tasks as written, on a throwaway store and the
    in-memory broker (``make_test_app``'s settings, ``config`` over them), for the
    block; its own configuration is put back after it.

    ``app`` must already have ``AGBoss(app)`` (the application's module calls it).
    Celery's cached broker pool, result backend and queues are dropped on the way in
    and out, so bind before the test uses the app. Messages go to a queue of the
    block's own, deleted at the end.
    """
    runtime = AGBoss.of(app)
    queue = f"agboss-test-{os.getpid()}-{next(_counter)}"
    overrides = {**throwaway_app_config(database_url, queue), **dict(config or {})}
    saved = {key: app.conf.get(key, _UNSET) for key in overrides}
    saved_clock = runtime.clock_offset_source
    app.conf.update(overrides)
    _forget_connections(app)
    runtime.reconfigure()
    runtime.clock_offset_source = clock_offset_source
    try:
        yield app
    finally:
        runtime.close()
        _delete_queue(app, queue)
        app.conf.update({key: None if value is _UNSET else value for key, value in saved.items()})
        _forget_connections(app)
        runtime.reconfigure()
        runtime.clock_offset_source = saved_clock


def _forget_connections(app: Celery) -> None:
    """Celery caches its broker pool, result backend and queues on first use; a bound
    app's must be made again from the conf it has now."""
    pool, app._pool = app._pool, None  # not app.close(): that deregisters the app
    if pool is not None:
        pool.force_close_all()
    app._backend_cache = None
    app._local = threading.local()
    app.__dict__.pop("amqp", None)


def _wake_until_stopped(app: Celery, worker: Any) -> Callable[[], None]:
    """Ask the worker to stop, and keep waking its event loop until it has.

    Celery's loop for in-memory brokers notices a stop only between waits of 2 s on
    the broker (twice: 4 s per test). A control message to this worker ends each wait
    at once; it is a ``ping`` nobody answers, so it leaves nothing behind.
    """
    worker_state.should_terminate = 0
    done = threading.Event()

    def wake() -> None:
        with app.connection_for_write() as conn:
            for _ in range(int(60 / WAKE_INTERVAL_SECONDS)):  # bounded: a minute at most
                app.control.broadcast(
                    "ping", destination=[worker.hostname], reply=False, connection=conn
                )
                if done.wait(WAKE_INTERVAL_SECONDS):
                    return

    waker = threading.Thread(target=wake, name="agboss-worker-waker", daemon=True)
    waker.start()

    def stop() -> None:
        done.set()
        waker.join(5)

    return stop


def close_test_app(app: Celery) -> None:
    """Close the app's store, unhook its signal handlers, drop its queue, close the app."""
    runtime = AGBoss.of(app)
    try:
        runtime.close()
    finally:
        agboss_signals.disconnect(runtime)
        _delete_queue(app, app.conf.task_default_queue)
        app.close()


def _delete_queue(app: Celery, queue: str) -> None:
    """In-memory queues live as long as the process: drop this app's when it is done."""
    if str(app.conf.broker_url).startswith("memory://"):
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)


@contextmanager
def running_worker(
    app: Celery,
    *,
    pool: str = "threads",
    concurrency: int = 2,
    shutdown_timeout: float = 10.0,
    **options: Any,
) -> Iterator[Any]:
    """A real Celery worker for ``app`` in a thread of this process, stopped on exit.

    Tasks declared after it started are picked up when they are first published
    (a plain worker would drop them as unregistered). Celery makes the worker's app
    the process's default one; the previous default is put back on exit.
    """
    saved_default = celery_state.default_app
    saved_current = getattr(celery_state._tls, "current_app", None)
    consumer_box: list[Any] = []

    def pick_up_new_tasks(sender: Any = None, headers: Any = None, **_: Any) -> None:
        name = (headers or {}).get("task", sender)
        if not consumer_box or not isinstance(name, str) or name not in app._tasks:
            return
        consumer = consumer_box[0]
        if name not in consumer.strategies:
            consumer.update_strategies()

    stop_waking: Callable[[], None] | None = None
    worker: Any = None
    celery_signals.before_task_publish.connect(pick_up_new_tasks, weak=False)
    try:
        with start_worker(
            app,
            pool=pool,
            concurrency=concurrency,
            perform_ping_check=False,
            shutdown_timeout=shutdown_timeout,
            **options,
        ) as worker:
            consumer_box.append(worker.consumer)
            try:
                yield worker
            finally:
                stop_waking = _wake_until_stopped(app, worker)
    finally:
        if stop_waking is not None:
            stop_waking()
        celery_signals.before_task_publish.disconnect(pick_up_new_tasks)
        celery_state.set_default_app(saved_default)
        celery_state._set_current_app(saved_current)
        if worker is not None:
            _stop_pool(worker.pool, shutdown_timeout)
            _delete_queue(app, app.control.mailbox.get_queue(worker.hostname).name)


def _stop_pool(pool: Any, timeout: float) -> None:
    """Celery terminates the pool, which leaves a threads pool's idle threads running;
    stopping it joins them (bounded: a task stuck in a thread must not hang the test)."""
    if pool is None:
        return
    stopper = threading.Thread(target=pool.stop, name="agboss-pool-stop", daemon=True)
    stopper.start()
    stopper.join(timeout)


__all__ = [
    "bound_app",
    "close_test_app",
    "make_test_app",
    "running_worker",
]
