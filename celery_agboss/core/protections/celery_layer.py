"""The switches of the Celery layer: one delivery and the task, what is recorded
around it (publishes, held messages, the outbox, undo tasks), the sweep and the
operator's verbs, webhooks and adapters, frameworks. Read through
``celery_agboss.core.protections``, their one home."""

from __future__ import annotations

# One delivery (delivery/) and the task (task.py).

NESTED_DIRECT_CALL_ALLOWED = "nested-direct-call-allowed"
"""Sabotage: a body that calls its own task directly (``pay(...)``) runs a nested
delivery of its own execution, which finds the lease live and is deferred: the body's
``Ignore`` ends the execution COMPLETED with nothing charged."""

BEFORE_START_OUTSIDE_THE_DELIVERY = "before-start-outside-the-delivery"
"""Sabotage (design: what fails an execution): a task's ``before_start`` that raises
fails the message before any delivery: acknowledged, the execution stays REQUESTED and
the sweep re-publishes it for ever, nobody told."""

EAGER_IGNORE_READ = "eager-ignore-read-as-success"
"""Sabotage: an eager run that ended unfinished (paused, waiting) returns None, as
Celery reads an Ignore, so a test suite reads a paused payment as paid."""

FAILURE_FOR_AN_UNFINISHED_EXECUTION = "failure-for-an-unfinished-execution"
"""Sabotage: Celery writes FAILURE and fires errbacks for an execution that is only waiting
or about to be continued (a hard time limit, a retry whose publish failed)."""

RETRY_PUBLISH_FAILURE_REJECTS = "retry-publish-failure-rejects"
"""Sabotage: a retry whose publish failed is Celery's ``Reject(requeue=False)``, so the
message is dropped as failed while the execution only waits."""

PACKAGE_RETRIES_COUNTED = "package-retries-counted"
"""Sabotage: the application's ``max_retries`` counts celery_agboss's own retries too (an
unknown outcome's), so ``autoretry_for`` gives up early."""

REPUBLISH_FORGETS_OWN_RETRIES = "republish-forgets-own-retries"
"""Sabotage (design: what Celery records): a re-published message (the sweep's re-drive, a
woken release, an operator's) drops the count of the package's own retries but keeps
Celery's ``retries``, so they all count against the application's ``max_retries`` and its
next ``self.retry()`` fails a payment that went through."""

RETRY_KEEPS_EXPIRES = "retry-keeps-expires"
"""Sabotage (design: expires bounds the start): ``self.retry()`` carries the message's ``expires``,
so a retry after it is dropped by the worker while the execution, charged, waits for it."""

REPLACE_HANDED_TO_CELERY = "replace-handed-to-celery"
"""Sabotage: ``self.replace()`` is Celery's: the replacement runs under this execution's
id, finds it COMPLETED(None) and replays that instead of running, so the payments it
would have made are never made."""

UNDO_ON_ANY_FAILURE = "undo-on-any-failure"
"""Sabotage (design: P5): a delivery that ended without a verdict (a hard time limit, a kill)
counts as a failure, so the delivery that takes it over runs the undos instead of
continuing the body — refunding a payment that went through and whose order goes on."""

FAILURE_SKIPS_UNDO = "failure-skips-undo"
"""Sabotage: a real failure ends ``FAILED`` without running the undos it declared, as
before undo existed: the customer stays charged for an order that failed."""

UNDO_TASK_FAILURE_ENDS_FAILED = "undo-task-failure-ends-failed"
"""Sabotage (design: undo once): an undo declared as a signature whose task's body fails
(its refund declined) ends that task ``FAILED``, like any task: its parent reads undone,
the charge stays unrefunded, and no listing names either to a person."""

WAKE_FOLDED_INTO_REFUSED_RETRY = "wake-folded-into-refused-retry"
"""Sabotage: a deferred duplicate's wake is cleared into a retry that Celery then refuses
(past max_retries), so no message carries the continuation."""

REQUEUE_WITHOUT_PAUSE = "requeue-without-pause"
"""Sabotage: a message handed back to the broker because the store is down is
redelivered at once, over and over, for as long as the outage lasts."""

NEWER_STATE_HANDED_BACK_AT_ONCE = "newer-state-handed-back-at-once"
"""Sabotage: a message of an execution a newer version wrote goes back to the broker
after the same short pause each time, however often the broker handed it back: a quorum
queue's ``delivery-limit`` drops it within seconds, and the payment it carried stops."""

HAND_BACK_PAUSE_IGNORES_TIME_LIMITS = "hand-back-pause-ignores-time-limits"
"""Sabotage: the pause before a message goes back to the broker runs past the delivery's
time limits, and a soft limit landing in it escapes as the task's error: Celery
acknowledges the message, and the payment it carried waits for a sweep's re-publish."""

FENCE_RECORDED_AS_FAILURE = "fence-recorded-as-failure"
"""Sabotage: a fenced (superseded) delivery lets Celery record a FAILURE, over the
holder that finished the payment."""

CANCEL_REQUEST_IGNORED = "cancel-request-ignored"
"""Sabotage: a delivery of an execution with a cancel request runs the body as if
there were none, at its start and at every outbound call (a pending intent is
reconciled, and resent when it was not sent)."""

REJECT_WAITS_FOR_THE_SWEEP = "reject-waits-for-the-sweep"
"""Sabotage: a body's own ``Reject(requeue=False)`` leaves the execution WAITING, so the
sweep brings back what the body dropped, again and again until it is PARKED."""

LEASE_KEPT_AFTER_A_BROKEN_END = "lease-kept-after-a-broken-end"
"""Sabotage: a delivery whose own end-of-run code raised keeps its lease renewed for as
long as the worker process lives: the execution looks RUNNING, and the sweep never
takes it."""

TIME_LIMIT_FAILS_THE_TASK = "time-limit-fails-the-task"
"""Sabotage: a hard time limit is handled as Celery does it — FAILURE written (unless the
result backend withholds it), ``on_failure`` and the errbacks run — for an execution
that will be continued and may already have charged."""

REVOKED_ID_DROPS_LATER_MESSAGES = "revoked-id-drops-later-messages"
"""Sabotage (design: cancel request): a payment message whose id is in the worker's revoked
set is dropped as Celery drops it, for the hours the worker keeps the id: a revoked
execution's undo, retry or re-drive never runs there, and its refund is never sent."""

REVOKE_BROADCAST_NOT_RECORDED = "revoke-broadcast-not-recorded"
"""Sabotage (design: cancel request): a revoke's broadcast is not recorded in the store (as
``celery control revoke ID`` was not, which broadcasts without ``app.control.revoke``): a
running body revoked so goes on and charges."""

EXPIRY_REVOKES_THE_ID = "expiry-revokes-the-id"
"""Sabotage (design: expires bounds the start): a message past its ``expires`` is dropped
as Celery drops it, its id added to the worker's revoked set, so that every later
message of a started execution (its retry, its re-drive) is dropped as revoked and
recorded as a cancel: a charged order cancelled, or an order never charged."""

REPLAY_SENDS_LINKS = "replay-sends-links"
"""Sabotage: a duplicate that replays a terminal execution sends its chain and callbacks
again, although the completing delivery already did."""

UNSTORED_RESULT_REPLAYED_AS_FAILURE = "unstored-result-replayed-as-failure"
"""Sabotage: a duplicate of a completed execution whose result this store cannot hand back
raises, so Celery writes FAILURE over the SUCCESS the completing delivery stored, and
fires ``link_error`` (an errback that refunds the order)."""

REPLAY_COUNTS_CHORD = "replay-counts-chord"
"""Sabotage: a duplicate of a completed chord header part counts its part again, so a
counter backend (Redis) thinks the header done early, or fails the chord."""

REPLAY_RECOUNTS_STORED_CHORD_PART = "replay-recounts-stored-chord-part"
"""Sabotage: a duplicate of a completed chord header part whose links were not recorded as
sent counts its part again although the result backend holds its result (so it was
counted), and a key-value result backend fails the chord: the body never runs."""

FAILED_LINK_SEND_RECORDED_SENT = "failed-link-send-recorded-sent"
"""Sabotage: a send of the links (the chain's next step) that raised after the execution
completed is recorded as sent (``links_dispatched``), so no delivery sends them again."""

FAILED_LINK_SEND_ACKED = "failed-link-send-acked"
"""Sabotage: the message of a completed execution whose links could not be sent is
acknowledged, not handed back to the broker, so nothing sends the chain's next step."""


# What the Celery layer records around a delivery: publishes, held messages, the outbox, undo tasks.

HELD_NOT_REPORTED = "held-messages-not-reported"
"""Sabotage: a worker never says which messages it holds unstarted; killed, they wait
for ``agboss_requested_grace`` (Redis hides them for its visibility timeout)."""

LINK_IDS_NOT_FIXED = "link-ids-not-fixed"
"""Sabotage (design: publishes from a body): an execution's unfrozen links get a new id
each time a delivery sends them, so a duplicate that replays them starts a second execution."""

CANVAS_LINK_MEMBERS_UNFIXED = "canvas-link-members-unfixed"
"""Sabotage: only a link's own id is fixed, not the tasks inside a group, chain or chord
link, so each send of the link sends them under new ids: a second charge."""

PUBLISH_WITHOUT_RECORD = "publish-without-record"
"""Sabotage (design: trap 9): a publish the store could not record goes to the broker anyway, and
a message the broker then loses leaves no trace."""

SHUTDOWN_HANDS_OVER_RUNNING_LEASES = "shutdown-hands-over-running-leases"
"""Sabotage (design: PS12): a stopping worker releases the leases of the bodies it still runs, so
another worker re-runs a step whose charge is still on the wire here."""

PLAIN_TASK_LEFT_REQUESTED = "plain-task-left-requested"
"""Sabotage (design: unmanaged): a recorded message that runs as a plain task leaves its
execution ``REQUESTED``, so the sweep publishes it again and again until it is PARKED:
one charge per run."""

BODY_PUBLISHES_GET_NEW_IDS = "body-publishes-get-new-ids"
"""Sabotage (design: publishes from a body): a PaymentTask or a canvas published from a body gets
new ids on every re-run, and a canvas is not recorded: two executions, two shipping charges."""

EAGER_BODY_PUBLISH_UNKEYED = "eager-body-publish-unkeyed"
"""Sabotage (design: publishes from a body): a PaymentTask run in process from a body
(``task_always_eager``, or ``apply()``) never reaches ``send_task`` and gets a new id on
every re-run of the body: two executions, two shipping charges."""

BODY_PUBLISH_IGNORES_CANCEL = "body-publish-ignores-cancel"
"""Sabotage (design: publishes from a body): a PaymentTask published alone from a body whose
cancel was recorded is recorded and sent all the same: the customer of a cancelled order is
charged for its shipping."""

BODY_PUBLISH_THROUGH_ANOTHER_APP_ALLOWED = "body-publish-through-another-app-allowed"
"""Sabotage (design: publishes from a body): a PaymentTask a body publishes through another
Celery app's ``send_task`` is recorded under the new id that app gives it on every re-run of
the body: a retried body charges twice."""

OTHER_APPS_OWN_PUBLISH_TAKEN = "other-apps-own-publish-taken"
"""Sabotage (design: publishes from a body): with two ``AGBoss`` apps in one process, a
publish through one app's ``send_task`` of a task that app records itself is taken by the
other app too, when its ``agboss_payment_tasks`` match the name: the body's retry under
its own id is refused there as a new id from a body, and the paid execution never ends."""

UNDO_PUBLISHES_COUNTED_IN_THE_DELIVERY = "undo-publishes-counted-in-the-delivery"
"""Sabotage (design: publishes from a body): a publish from an undo is counted in the delivery, not
in its undo, so a delivery that skips the undos done already publishes under shifted ids."""

PUBLISHED_WITHOUT_COMMIT = "outbox-published-without-commit"
"""Sabotage: what ``fn`` enqueued is published from memory when the effect ends, committed
or not — as a publish placed before the commit would be: a rolled-back effect's
follow-up runs."""

SWEEP_NOT_REPUBLISHING = "outbox-sweep-not-republishing"
"""Sabotage: the sweep leaves unpublished rows alone, so a follow-up whose worker died
between the commit and the publish never runs."""

UNDO_TASK_PUBLISHED_DIRECTLY = "undo-task-published-directly"
"""Sabotage: an undo declared as a signature is published straight from the undo under a
new task id on every run, not enqueued under its step's key: an undo run again after a
crash (after its publish, before its done mark) publishes it again, and it refunds twice."""


REFUSED_PUBLISH_KEEPS_ITS_POSITION = "refused-publish-keeps-its-position"
"""Sabotage (design: publishes from a body): a publish from a body that the broker refused
keeps the position it took, so the body's retry of it gets the next position's id: the
refused execution, recorded, is revived by the sweep beside the retry's — two charges."""

REFUSED_PUBLISH_LEFT_FOR_THE_SWEEP = "refused-publish-left-for-the-sweep"
"""Sabotage (design: trap 9): a publish the broker refused (the caller saw the error) leaves
its recorded execution ``REQUESTED``; the caller's retry under a new id and the sweep's
revival of the refused one both run — two charges."""

SEND_TASK_ID_READ_FROM_ETA = "send-task-id-read-from-eta"
"""Sabotage (design: publishes from a body): ``send_task``'s positional arguments are read one
place off, so a body's ``send_task(name, args, kwargs, countdown, eta)`` is taken for one
that named its own id and gets a new id on every re-run — two executions."""

# The sweep (sweep/) and the operator's verbs (operator/).

OPERATOR_RESULT_UNCHECKED = "operator-result-unchecked"
"""Sabotage: ``resolve --completed`` stores whatever JSON it is given (a bare charge id
pasted from the dashboard); the next delivery replays it into a body that expected the
receipt, and fails there."""

OPERATOR_GATEWAY_ID_REPLACED = "operator-gateway-id-replaced"
"""Sabotage: ``resolve --completed`` takes a result naming another payment than the one
the gateway's own answer named (a neighbouring row's receipt, pasted): the intent then
says its order was paid by that charge, and a refund built from it refunds the other."""

CANCEL_OF_AN_ENDED_EXECUTION_REPORTED = "cancel-of-an-ended-execution-reported"
"""Sabotage: a ``cancel`` whose execution completed between the operator's checks and the
store's lock reports "cancel requested" (exit 0): the operator believes the order is
being cancelled while its payment stands, and refunds nothing."""

REDRIVE_NOW_IGNORES_NOT_BEFORE = "redrive-now-ignores-not-before"
"""Sabotage (design: re-driven when due): an operator's verb publishes an execution again
at once whatever its ``not_before``: one waiting for the retry its body asked for (the
balance charged an hour after the deposit, once a cooling-off is over) runs an hour early.
"""

SWEEP_WITHOUT_TICK = "sweep-without-tick"
"""Sabotage (design: trap 10): every beat's sweep runs, even when another already ran this tick."""

STRANDED_NOT_RECONCILED = "sweep-stranded-not-reconciled"
"""Sabotage (design: sweep reconciles): the sweep leaves a dead holder's PENDING intent to the next
delivery; with that delivery's reconcile-first also off, a charge is sent again."""

REDRIVE_WITHOUT_CLAIM = "sweep-redrive-without-claim"
"""Sabotage (design: trap 10): re-publish what the listing found without the compare-and-set
claim, so two sweepers publish one execution twice."""

UNOPENED_REDRIVE_UNCOUNTED = "sweep-unopened-redrive-uncounted"
"""Sabotage (design: recovery cap, sealed at rest): a taken-over or planned row no key
opens is claimed by every re-drive and never counted (no delivery follows to count it):
it fails every run and never parks, so no operator is shown it."""

UNSENT_LINKS_WITHOUT_CLAIM = "sweep-unsent-links-without-claim"
"""Sabotage (design: sweep): re-publish a completed execution whose links were never sent
without the compare-and-set claim, so two sweepers publish it twice."""

UNSENT_LINKS_PAST_RETENTION = "sweep-unsent-links-past-retention"
"""Sabotage (design: unsent links): re-publish a completed execution of any age, one that
retention deletes before its message is taken; the replay finds no row and charges again."""

UNSENT_LINKS_BACKEND_NOT_READ = "sweep-unsent-links-backend-not-read"
"""Sabotage (design: unsent links): re-publish a completed execution whose links went out
and only their record was lost, without asking the result backend: its replay sends them
again and a plain callback runs twice."""


# Webhooks (webhooks/) and the gateway adapters (adapters/).

EVENT_NOT_KEYED = "webhook-event-not-keyed"
"""Sabotage (design: PS15): the event's effect is a fenced effect of the delivery's own
execution, without the event's business key: every delivery applies it again."""

ADYEN_FIELDS_UNCHECKED = "adyen-signed-fields-unchecked"
"""Sabotage: an Adyen item's signed fields are not checked before their HMAC (a ``:`` in
one, a reference of another shape) nor its merchant account after it, so one genuine
notification, its fields split again at other colons, passes as another event."""

EVERY_ERROR_DEFINITE = "adapter-every-error-definite"
"""Sabotage: every adapter calls every error definite (a timeout is resent as new)."""

ADOPTS_ANY_PAYMENT = "adapter-adopts-any-payment"
"""Sabotage (design: only the request's payment): every adapter takes the payment it finds, or the
answer a key replays, for the request's own, whatever its amount, currency, reference or key: an
order is marked paid with another order's payment, and its customer is never charged."""


STRIPE_RECONCILE_READS_THIS_REQUEST = "stripe-reconcile-reads-this-request"
"""Sabotage (design: only the request's payment): Stripe's capture, void and refund reconcile
read the payment from this delivery's request, not the stored one: another request under
the key makes an uncaptured authorisation pass for captured."""

PAYPAL_ORDER_CREATED_WITH_SOURCE = "paypal-order-created-with-source"
"""Sabotage (design: sweep reconciles): PayPal's order is created with the vaulted
payment source, which PayPal may pay at once; a reconcile that replays the create pays a
charge that never reached PayPal, from the sweep or a cancel."""

CHECKOUT_CAPTURE_ALL_IGNORES_EARLIER = "checkout-capture-all-ignores-earlier"
"""Sabotage (design: PS18): Checkout.com's reconcile of a capture without an amount takes
"all of it" for the whole authorisation, not what earlier partial captures left: the
capture of the rest, made, is reported unknown and waits for an operator."""

CHECKOUT_TIMES_COMPARED_AS_TEXT = "checkout-times-compared-as-text"
"""Sabotage (design: only the request's payment): Checkout.com's ``processed_on`` times are
ordered as strings, so ``…:00Z`` comes after ``…:00.5Z``: a refund or capture of what was
left, made, is reported unknown and waits for an operator."""

CHECKOUT_REFUND_ALL_IGNORES_LATER_CAPTURES = "checkout-refund-all-ignores-later-captures"
"""Sabotage (design: only the request's payment): Checkout.com's reconcile of a refund
without an amount takes "all of it" from today's ``total_captured``, captures made after
the refund included: the refund, made, is reported as another's and waits for an
operator, whose late ``--not-sent`` refunds the whole payment again."""

# Frameworks (contrib/).

DJANGO_WRITES_OFF_THE_FENCE = "django-writes-off-the-fence"
"""Sabotage (design: P2): a fenced effect in a Django project runs on the store's own
connection, not in Django's transaction: the ORM writes of its ``fn`` commit on Django's
connection by themselves, a zombie's included."""

DJANGO_PUBLISH_BEFORE_COMMIT = "django-publish-before-commit"
"""Sabotage: a ``PaymentTask`` published inside the caller's ``atomic`` is sent at once,
as a plain ``.delay()`` is: a request rolled back after it still has its payment sent."""

DJANGO_SILENT_ROLLBACK_PASSES = "django-silent-rollback-passes"
"""Sabotage (design: P2): a fenced effect whose ``fn`` marked Django's transaction for
rollback passes for written: Django rolls the effect back without a word, and the body
goes on as if the order were marked paid."""

DJANGO_OTHER_ALIAS_WRITES_PASS = "django-other-alias-writes-pass"
"""Sabotage (design: P2): a fenced effect's ``fn`` may write to another Django alias than
the store's: that write commits on its own, and stays when the effect rolls back."""

DJANGO_COMMIT_TEXT_PASSES = "django-commit-text-passes"
"""Sabotage (design: P2): a ``COMMIT`` (``END``, ``ROLLBACK``) sent as SQL text through
Django's cursor inside a fenced effect passes: the writes before it commit on the fence's
first check alone, and a holder that lost its lease has its write twice."""

# The broker (runtime/broker_defaults.py).

PUBLISHER_CONFIRMS_LEFT_UNSET = "publisher-confirms-left-unset"
"""Sabotage: ``AGBoss(app)`` leaves ``broker_transport_options["confirm_publish"]``
unset, kombu's default for RabbitMQ: a message the broker drops after accepting its
bytes (a full queue that rejects publishes) is recorded as sent, its outbox row marked
published, and the follow-up it carried never runs, nobody told."""

FIRST_RUN_GETS_UNKEPT_ARGUMENTS = "first-run-gets-unkept-arguments"
"""Sabotage: under a serializer other than JSON (pickle), a body's first run gets the
message's own arguments while every re-run is sent from the store's JSON copy: int dict
keys come back as strings, the re-run's replay is refused as another request and the
paid execution's undo refunds the good charge."""
