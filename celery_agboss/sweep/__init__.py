"""The sweep (design: sweep): what dead workers, lost messages and missed answers left.

``runner`` holds the ``celery_agboss.sweep`` task, its beat entry and the workers'
watch on ``last_sweep_at``; ``steps`` holds what one run does, step by step.
"""

from __future__ import annotations

from celery_agboss.sweep.runner import (
    DEFAULT_BATCH_SIZE,
    SWEEP_TASK_NAME,
    check_sweep_freshness,
    install,
    run_sweep,
    run_sweep_loop,
    sweep_freshness,
)
from celery_agboss.sweep.steps import SweepReport

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "SWEEP_TASK_NAME",
    "SweepReport",
    "check_sweep_freshness",
    "install",
    "run_sweep",
    "run_sweep_loop",
    "sweep_freshness",
]
