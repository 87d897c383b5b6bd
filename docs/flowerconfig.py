"""An example ``flowerconfig.py`` for celery_agboss.

Run ``FLOWER_BASIC_AUTH=oncall:<password> celery -A proj flower --conf=flowerconfig.py``;
Flower executes this file and reads the option names it defines. It listens on
127.0.0.1 only and refuses to start without credentials: Flower shows every payment's
arguments and results, and its API can revoke tasks. Put a TLS-terminating proxy with
its own access control in front of it to reach it from elsewhere.
"""

import os

# Surfaces celery_agboss's outcome of each task (SUCCESS · RECONCILED, · REPLAYED,
# · DEFERRED…) and blanks card numbers; importing it also keeps the custom event
# fields on the copies Flower formats.
from celery_agboss.flower import format_task  # noqa: F401

# The state column carries the outcome; args (argsrepr) and the result help the on-call.
tasks_columns = "name,uuid,state,args,result,received,runtime,worker"

# Loopback only; Flower's --address on the command line is the one way to widen it.
address = "127.0.0.1"
port = 5555

# Credentials from the environment, never from this file: FLOWER_BASIC_AUTH is
# "user:password" (several separated by commas), or FLOWER_AUTH with Flower's OAuth2
# settings (FLOWER_AUTH_PROVIDER, FLOWER_OAUTH2_KEY, ...). With either, every page and
# the API ask for them (FLOWER_UNAUTHENTICATED_API is then ignored); /healthcheck and
# /metrics (event counts by task name and worker, no arguments) are Flower's own
# exceptions.
MIN_PASSWORD_LENGTH = 12


def _basic_auth(value):
    """The ``user:password`` pairs of ``value``; SystemExit naming what is wrong."""
    pairs = [pair.strip() for pair in value.split(",") if pair.strip()]
    for pair in pairs:
        user, colon, password = pair.partition(":")
        if not colon or not user or len(password) < MIN_PASSWORD_LENGTH:
            raise SystemExit(
                "flowerconfig.py: FLOWER_BASIC_AUTH must be user:password with a password of "
                f"at least {MIN_PASSWORD_LENGTH} characters (one pair, or several separated "
                f"by commas); {user or 'an entry'!r} has none that long. Flower was not started."
            )
    return pairs


if os.environ.get("FLOWER_AUTH"):
    auth = os.environ["FLOWER_AUTH"]  # OAuth2: Flower reads its other FLOWER_* settings
elif os.environ.get("FLOWER_BASIC_AUTH", "").strip():
    basic_auth = _basic_auth(os.environ["FLOWER_BASIC_AUTH"])
else:
    raise SystemExit(
        "flowerconfig.py: no credentials: set FLOWER_BASIC_AUTH=user:password (a password "
        f"of at least {MIN_PASSWORD_LENGTH} characters, from your secret store) or "
        "FLOWER_AUTH with Flower's OAuth2 settings. Flower was not started: it shows every "
        "payment's arguments and results, and its API can revoke tasks."
    )

# Keep enough tasks in memory to see the last few hours of payments.
max_tasks = 50000
