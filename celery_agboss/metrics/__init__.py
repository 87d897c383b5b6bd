"""Prometheus metrics (``pip install celery_agboss[metrics]``; docs/metrics.md).

- counters, moved by the structured log events in every process of a worker (the pool
  children too: ``prometheus_client``'s multiprocess mode), ``catalogue`` says which;
- gauges of the store (pending intents, intents needing an operator, executions by
  state, seconds since the last sweep), read at scrape time (``StoreCollector``);
- the worker's endpoint when ``agboss_metrics_port`` is set (``worker``), and
  ``celery -A proj agboss metrics`` for one exposition (``exposition``).

Importing this package imports no ``prometheus_client``: that waits until metrics
are asked for, and its absence then says which extra to install.
"""

from __future__ import annotations

from celery_agboss.metrics.catalogue import METRICS, MetricSpec
from celery_agboss.metrics.exporter import StoreCollector, exposition

__all__ = ["METRICS", "MetricSpec", "StoreCollector", "exposition"]
