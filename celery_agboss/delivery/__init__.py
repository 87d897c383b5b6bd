"""One delivery of a ``PaymentTask``, which only ``celery_agboss.task`` drives.

- ``lifecycle``: start the execution, run the body under the lease, map how it ended
  to a Celery outcome (design: what Celery records), with the ends the other parts share;
- ``delivery_like``: what those other parts use of a delivery;
- ``replaying``: a duplicate of a terminal execution gets the stored outcome;
- ``waits``: retries, and long waits kept in the store, not the broker;
- ``cancelling``: a delivery of an execution with a cancel request reconciles, then
  ends ``CANCELLED``;
- ``compensating``: the declared undos, after a real failure or a cancel;
- ``verdicts``: what a delivery writes at its end, a closed set;
- ``outcomes``: how results and failures are kept for a late duplicate;
- ``time_limits``: the worker's hard time limit, handled as a continuation.
"""
