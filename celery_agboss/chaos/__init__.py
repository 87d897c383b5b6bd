"""The chaos explorer: random faults thrown at a real shop, then the money counted.

``python -m celery_agboss.chaos [--orders N] [--seed S] [--store sqlite|postgres]
[--broker URL]`` generates an example shop (a ``PaymentTask`` charging through
``self.outbound`` and marking the order paid with a ``fenced_effect``), runs real
``celery worker`` processes and one ``celery beat`` against the given broker and
store, always talking to a fake gateway this process serves on 127.0.0.1, kills,
freezes and stops them on a seeded schedule, waits until the shop is quiet and
prints the verdict: paid once, declined, waiting for an operator, paid twice, lost
(a payment that is not the order's included), phantom refunds, payments for no
order, orders not placed (docs/reliability.md).

Exit codes: 0 the money is right and every order was placed; 1 the money is wrong: a
double charge, a lost order (or one whose payment is not the order's: another amount
or currency, not captured in full), a phantom refund or a payment for no order of the
run; 2 the explorer could not run (a bad option, the
broker or the store not answering, a store database that holds other data) or did
not run as asked: some or all orders were never placed (every publish refused), so
the verdict covers only the others; 130 interrupted.
"""

from __future__ import annotations

from celery_agboss.chaos.options import (
    EXIT_COULD_NOT_RUN,
    EXIT_INTERRUPTED,
    EXIT_MONEY_WRONG,
    EXIT_OK,
    ChaosOptions,
    CouldNotRun,
)
from celery_agboss.chaos.run import main, run

__all__ = [
    "EXIT_COULD_NOT_RUN",
    "EXIT_INTERRUPTED",
    "EXIT_MONEY_WRONG",
    "EXIT_OK",
    "ChaosOptions",
    "CouldNotRun",
    "main",
    "run",
]
