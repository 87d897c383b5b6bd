"""An example ``flowerconfig.py`` for celery_agboss.

Run ``celery -A proj flower --conf=flowerconfig.py``; Flower executes this file and reads
the option names it defines.
"""

# Surfaces celery_agboss's outcome of each task (SUCCESS · RECONCILED, · REPLAYED,
# · DEFERRED…) and blanks card numbers; importing it also keeps the custom event
# fields on the copies Flower formats.
from celery_agboss.flower import format_task  # noqa: F401

# The state column carries the outcome; args (argsrepr) and the result help the on-call.
tasks_columns = "name,uuid,state,args,result,received,runtime,worker"

# Never expose the API without authentication; pick one:
basic_auth = ["oncall:change-me"]
# auth = ".*@example\\.com"   # with the OAuth2 settings of your provider

# Keep enough tasks in memory to see the last few hours of payments.
max_tasks = 50000
