"""One delivery of a ``PaymentTask``, which only ``celery_agboss.task`` drives.

- ``lifecycle``: start the execution, run the body under the lease, map how it ended
  to a Celery outcome (DESIGN §2.2);
- ``cancelling``: a delivery of an execution with a cancel request reconciles, then
  ends ``CANCELLED``;
- ``waits``: long waits and retries kept in the store, not the broker;
- ``verdicts``: what a delivery writes at its end, a closed set;
- ``outcomes``: how results and failures are kept for a late duplicate;
- ``time_limits``: the worker's hard time limit, handled as a continuation.
"""
