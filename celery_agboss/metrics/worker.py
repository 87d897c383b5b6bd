"""The worker's metrics: on when ``agboss_metrics_port`` is set, off (nothing imported,
nothing counted) otherwise.

- ``worker_init`` (the main process, before the pool forks): choose the multiprocess
  directory (``agboss_metrics_dir``, else ``PROMETHEUS_MULTIPROC_DIR``, else a fresh
  temporary one for this worker), point ``prometheus_client`` at it, start counting
  the log events, and bind the endpoint. A missing extra or a port already taken
  stops the worker here, saying what to change, before it takes any task.
- ``worker_ready``: serve ``/metrics`` from a daemon thread of the main process. A
  scrape adds up every process's counts found in the directory (children forked and
  gone included: their files stay) and reads the store's gauges once, here.
- ``worker_process_shutdown`` (in a pool child that ends): ``mark_process_dead``.
- ``worker_shutdown``: stop serving, stop counting, remove the temporary directory.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import logging
import os
import shutil
import socket
import tempfile
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from celery import signals as celery_signals

from celery_agboss.core.log_events import add_event_observer, remove_event_observer
from celery_agboss.errors import ConfigurationError
from celery_agboss.metrics.exporter import (
    EventCounters,
    build_registry,
    known_names,
    require_prometheus,
    use_multiprocess_values,
)
from celery_agboss.runtime.app_runtime import Runtime
from celery_agboss.runtime.settings import AGBossSettings

logger = logging.getLogger("celery_agboss")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds are not worth a line each."""


class WorkerMetrics:
    """One worker's metrics: its directory, its counters and its endpoint."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.directory: str | None = None
        self.made_directory = False
        self.previous_env: str | None = None
        self.counters: EventCounters | None = None
        self.server: WSGIServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str | None:
        if self.server is None:
            return None
        host, port = self.server.server_address[:2]
        text = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{text}]" if ":" in text else text
        return f"http://{shown}:{port}/metrics"

    def start(self, settings: AGBossSettings) -> None:
        """Before the pool forks: the bound (not yet served) port, then the directory and
        the counting. A port that cannot be had changes nothing."""
        require_prometheus()
        self.server = self._bind(settings)
        try:
            self.directory = self._directory(settings)
        except OSError as exc:
            self.stop()
            raise ConfigurationError(
                f"agboss_metrics_dir: the metrics directory cannot be used ({exc}); set "
                "agboss_metrics_dir to a directory this worker may write",
                setting="agboss_metrics_dir",
            ) from None
        use_multiprocess_values(self.directory)
        self.counters = EventCounters(known_names(self.runtime))
        add_event_observer(self.counters.observe)
        from prometheus_client import make_wsgi_app

        self.server.set_app(make_wsgi_app(build_registry(self.runtime, self.directory)))

    @staticmethod
    def _bind(settings: AGBossSettings) -> WSGIServer:
        address, port = settings.metrics_address, settings.metrics_port
        assert port is not None
        server_class = _IPv6Server if ":" in address else _Server
        try:
            return make_server(
                address, port, _not_ready, server_class=server_class, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise ConfigurationError(
                f"agboss_metrics_port: cannot listen on {address}:{port} ({exc}); choose a "
                "free port (or agboss_metrics_address), or set agboss_metrics_port = 0 for "
                "no endpoint",
                setting="agboss_metrics_port",
            ) from None

    def _directory(self, settings: AGBossSettings) -> str:
        self.previous_env = os.environ.get(MULTIPROC_ENV)
        if settings.metrics_dir is not None:
            os.makedirs(settings.metrics_dir, exist_ok=True)
            # This worker's own directory: counts of an earlier run would add up again.
            for stale in glob.glob(os.path.join(settings.metrics_dir, "*.db")):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(stale)
            return settings.metrics_dir
        if self.previous_env:
            os.makedirs(self.previous_env, exist_ok=True)
            return self.previous_env  # the deployment's own: it empties it between runs
        self.made_directory = True
        return tempfile.mkdtemp(prefix="agboss-metrics-")

    def serve(self) -> None:
        """In the main process once the pool runs: answer scrapes."""
        if self.server is None or self.thread is not None:
            return
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="agboss-metrics", daemon=True
        )
        self.thread.start()
        logger.info("celery_agboss metrics on %s (counts in %s)", self.url, self.directory)

    def child_exit(self) -> None:
        """In a pool child that ends: its live gauges go (its counts stay)."""
        if self.directory is None:
            return
        multiprocess: Any = importlib.import_module("prometheus_client.multiprocess")
        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(os.getpid(), self.directory)

    def stop(self) -> None:
        """Stop serving and counting; remove the directory made for this worker."""
        if self.counters is not None:
            remove_event_observer(self.counters.observe)
            self.counters = None
        server, self.server = self.server, None
        if server is not None:
            if self.thread is not None:
                server.shutdown()
                self.thread.join(5)
            server.server_close()
        self.thread = None
        if self.made_directory and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            if self.previous_env is None:
                os.environ.pop(MULTIPROC_ENV, None)
            self.made_directory = False
        self.directory = None


def _not_ready(environ: Any, start_response: Any) -> list[bytes]:
    """The app of a server bound before its registry is made (never served so)."""
    start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
    return [b"celery_agboss metrics are starting\n"]


def install(runtime: Runtime) -> None:
    """Called by ``AGBoss(app)``: the worker signals above, for this app's workers only."""
    app = runtime.app
    metrics = WorkerMetrics(runtime)
    started: list[int] = []  # the main process's pid, once metrics run in it

    def on_worker_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        try:
            settings = runtime.settings
            if settings.metrics_port is None:
                return
            metrics.start(settings)
        except ConfigurationError as exc:
            # Said once, as the exit message (Celery swallows Exceptions from handlers).
            raise SystemExit(f"celery_agboss refuses to start this worker: {exc}") from None
        started.append(os.getpid())

    def on_worker_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is app and started:
            metrics.serve()

    def on_child_exit(**_: Any) -> None:
        if started and os.getpid() != started[0]:
            metrics.child_exit()

    def on_worker_shutdown(**_: Any) -> None:
        if started and os.getpid() == started[0]:
            metrics.stop()

    runtime.listen(celery_signals.worker_init, on_worker_init)
    runtime.listen(celery_signals.worker_ready, on_worker_ready)
    runtime.listen(celery_signals.worker_process_shutdown, on_child_exit)
    runtime.listen(celery_signals.worker_shutdown, on_worker_shutdown)


__all__ = ["MULTIPROC_ENV", "WorkerMetrics", "install"]
