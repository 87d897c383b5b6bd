"""The product only as a user deploys it (README.md, "Using it from Celery" and
"Running it").

What the suite proves:

- the wheel built from this tree installs alone into a fresh virtualenv of the
  machine's ``python3`` (no system site-packages) and brings everything it needs
  and nothing else (``pip check``; no test-only package; the Redis transport's
  ``packaging`` is there);
- README.md's own ``shop.py`` (its first ``python`` block, written unchanged) and
  README.md's own commands (its ``sh`` block of "Running it" and its line for a
  second worker on one host, split with ``shlex``) run as given, from the venv,
  with no ``PYTHONPATH``, no ``-Q``/``-P``/``-c``/``--without-*`` and only the
  environment variables the README names;
- on Redis and RabbitMQ, on SQLite and PostgreSQL, every order is paid exactly
  once, counted at the gateway (which does not deduplicate keys, so a second send
  would be a second payment): when a whole worker is SIGKILLed mid-charge (on Redis
  its messages stay hidden for the 1 h visibility timeout, so only the sweep brings
  them back), when the broker loses every message before any worker started, and
  when beat was never started (the workers sweep themselves);
- a worker started with a ``-Q`` that leaves out the sweep's queue says so once.

Speed-ups (settings the README documents as ``AGBOSS_<NAME>`` variables, so a user
could set them the same way; defaults in brackets): ``AGBOSS_LEASE_TTL=5`` (30 s) so
a dead worker's lease expires soon, ``AGBOSS_SWEEP_INTERVAL=2`` (30 s) so beat sweeps
(and the workers' own sweeps start, after three intervals) soon,
``AGBOSS_REQUESTED_GRACE=3`` (300 s) so a message lost before it started is
re-published soon. The install and start tests use none.
"""
