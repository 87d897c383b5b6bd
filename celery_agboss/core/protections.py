"""Every protection a test may switch off, by name: the one home of the sabotage switches.

A guarantee test proves its protection by switching it off in a twin and counting the
harm (two payments at the fake gateway). The code that holds a protection reads
``sabotage.active(NAME)`` (``celery_agboss.core.sabotage``, which knows no other
names than these); only ``celery_agboss.testing.sabotage`` switches one off, and it
refuses outside a test run. None of these is ever a setting, and none is in a public
``__all__``.
"""

from __future__ import annotations

# The engine (core/): the outbound-call state machine, fenced effects, the lease, keys, undo.

NOT_SENT_LOOKUPS_NOT_BACKED_OFF = "not-sent-lookups-not-backed-off"
"""Sabotage: an intent whose lookups keep answering ``NotSent`` is looked up every 30 s for
ever, instead of backing off exponentially to the cap."""

FENCED_HOLDER_STARTS_UNDO = "fenced-holder-starts-undo"
"""Sabotage (design: P5): the reads that start an undo, and the start mark, go on past a fence —
as undo started from a failure handler outside the lease would: a holder superseded
mid-body, woken after the take-over completed the payment, refunds the paid order."""

INTENT_CAS_WITHOUT_PREDICATE = "intent-cas-without-predicate"
"""A compare-and-set that misses writes anyway (an UPDATE without its predicate) (design: R15)."""

CALLS_OF_ONE_KEY_CONCURRENT = "calls-of-one-key-concurrent"
"""Two threads of one delivery run ``outbound()`` under one key at once (design: R16): the
second reads the first's fresh claim as its own earlier attempt before the send is
registered in flight, finds ``NotSent`` and sends a second attempt under the key."""

UNDO_REFUSAL_REPLAYED_ON_REDRIVE = "undo-refusal-replayed-on-redrive"
"""An undo whose refund the gateway refused definitively waits for an operator without
authorising that refund to be sent again (design: retry authorisation): the operator's
``redrive`` runs the undo, which replays the refusal, and the customer is never
refunded by the engine."""

JOIN_ON_ANY_FINGERPRINT = "join-on-any-fingerprint"
"""Join a send in flight whatever request the joiner asked for (design: R16)."""

RELEASE_WITH_UNSETTLED_ATTEMPT = "release-with-unsettled-attempt"
"""Release the lease while a send under it is still running (design: R18, R23)."""

NO_KEY_AGE_CHECK = "no-key-age-check"
"""Resend a ``NotSent()`` whatever the key's age (design: R26, PS17)."""

UNKNOWN_ERRORS_ARE_DEFINITE = "unknown-errors-are-definite"
"""Every exception from send is a definite failure (FAILED, resent, no lookup)
(design: R25, PS1)."""

RECLAIM_BUMPS_TOKEN = "reclaim-bumps-token"
"""After a send overran (design: R23), the holder re-acquires its lease (token + 1) and carries on,
so its own send, still running, looks dead to everyone else."""

FINGERPRINT_NOT_CHECKED = "fingerprint-not-checked"
"""Another request under the same key is replayed, resent or reconciled
(design: PS7, PS20, PS22)."""

REPLAY_NOT_STORED_MARKER = "replay-not-stored-marker"
"""A replay of a result that could not be stored returns the marker as the result (design: R24)."""

SUPERSEDED_SILENTLY_REPORTED = "superseded-silently-reported"
"""An answer whose attempt was handed over is returned as if it had been stored (design: R20)."""

SEND_WITHOUT_LEASE_CHECK = "send-without-lease-check"
"""Send without checking the lease on the holder's clocks first (design: PS3)."""

PENDING_RESENT_WITHOUT_RECONCILE = "pending-resent-without-reconcile"
"""A pending intent is sent again (a new attempt) without asking reconcile first (design: PS5)."""

LIVE_OWNER_TAKEN_OVER = "live-owner-taken-over"
"""A pending intent (design: PS8) whose owner's lease is live (a send in flight in another
execution) is taken over and reconciled as if its owner were dead."""

SEND_NOT_BOUNDED = "send-not-bounded"
"""Wait for a send however long it takes (design: R22)."""

COMMIT_INSIDE_FENCED_EFFECT_ALLOWED = "commit-inside-fenced-effect-allowed"
"""A fenced effect's function may commit its own writes before the effect's record (design: P2)."""

CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY = "caught-signal-does-not-stop-delivery"
"""A body that catches an unknown outcome and calls again gets a new step key: a second
charge. With the protection, every later verb of that delivery raises the signal again."""

INTERRUPTED_SEND_STOPS_RENEWING = "interrupted-send-stops-renewing"
"""A wait interrupted (design: R18, R23) while its send is on the wire (KeyboardInterrupt, a soft
time limit) stops renewing the lease at once, so it can expire and be taken over, and
the payment looked up (and sent again) while the first send may still reach the gateway."""

PASSED_FAILURE_RESENT = "passed-failure-resent"
"""A definite failure (design: retry authorisation) is sent again by any execution that
reaches it, with no retry authorisation: the re-run of a body that went past it (it
caught the decline and charged a backup card), or a second click on the same order,
charges the first card too."""

DIVERGENCE_COMPLETED = "divergence-completed"
"""A re-run (design: divergence) whose body no longer reaches an intent an earlier delivery
created (it took another branch) completes anyway, hiding a payment that may exist."""

CANCEL_NOT_CHECKED_MID_BODY = "cancel-not-checked-mid-body"
"""A cancel (design: cancel request) requested while the body runs (a revoke without terminate) is
not looked at by its next outbound() or fenced_effect(): the charge still goes out."""

RECORD_USE_NOT_NOTED = "record-use-not-noted"
"""An execution (design: retention) that replays (or joins, or takes over) another execution's
intent or fenced effect is not noted as its user, so retention follows the creator only
and deletes a record a waiting execution still relies on."""

FENCED_EFFECT_NOT_REPLAYED = "fenced-effect-not-replayed"
"""A re-run (design: P2) does not replay a fenced effect's record: it runs ``fn`` again, so the
app's write goes in twice (or its own constraint refuses it and the paid order fails)."""

SQLITE_LONG_TRANSACTION_NOT_INTERRUPTED = "sqlite-long-transaction-not-interrupted"
"""On SQLite (design: lock bound) a fenced transaction may hold the single write lock as long as its
code runs, so every other execution's lease renewal waits behind it and their leases lapse."""

STORE_FAILURE_CATCHABLE = "store-failure-catchable"
"""A store failure (design: store errors) inside outbound() or fenced_effect() reaches the body as
an ordinary exception, so a body's ``except Exception`` fallback (another card) runs while
the first payment may exist."""

CANCEL_CHECKED_APART_FROM_RESEND = "cancel-checked-apart-from-resend"
"""A ``NotSent`` to resend checks the cancel request in a transaction of its own, before the
one that claims the resend (design: cancel request): a cancel recorded between the two is
followed by the send, a charge after the cancel."""

FOREIGN_ERROR_ESCAPES_CLAIMED_CALL = "foreign-error-escapes-claimed-call"
"""An ordinary exception that is not celery_agboss's (design: signals and errors) — a soft time
limit, a bug — raised once a call is claimed and before its outcome is recorded reaches the
body as it is, the intent left PENDING: a body that catches it and calls again gets ``#2``,
a second charge."""

STORED_ERROR_UNMASKED = "stored-error-unmasked"
"""The execution's stored failure (design: R17) keeps the exception's text and arguments as they
are, a decline quoting the card number included."""

REQUEST_STORED_UNMASKED = "request-stored-unmasked"
"""The intent stores the request as given, ignoring the call's masking policy (design: R17)."""

ONE_UNDO_PER_STEP = "one-undo-per-step"
"""Sabotage: a second ``undo_with`` after one step is taken for the first (kept once), so
only the first declared undo runs: the hold is released, the charge never refunded."""

UNDO_NOT_MARKED_DONE = "undo-not-marked-done"
"""Sabotage (design: PS10): an undo's done mark is neither written nor read, so every delivery of
a compensating execution runs every undo again, one already done included."""

UNDO_IGNORES_OTHER_EXECUTIONS = "undo-ignores-other-executions"
"""Sabotage: an execution undoes a step it shares as if it were alone on it — the
refund of a charge another execution completed on (a paid, shipped order)."""

PAYMENTS_BY_CREATOR = "payments-by-creator"
"""Sabotage: "did this execution move money?" counts only the intents it created, so a
cancel of an execution that sent the winning attempt of another's intent keeps it."""

DIVERGENCE_BY_CREATOR = "divergence-by-creator"
"""Sabotage: a re-run must reach only the intents its execution created: a charge it sent
through another execution's intent, then left for another path, is not noticed."""

COMPLETION_READ_FROM_EXECUTION_ROWS = "completion-read-from-execution-rows"
"""Sabotage: "another execution completed on this step" is read from that execution's own
row only, not from the record: once retention removed the row, its completed order's
charge is refunded by the other click's undo."""

REPLAY_AFTER_UNDO = "replay-after-undo"
"""Sabotage: a step whose undo is done is replayed like any completed one: a later click
gets the refunded charge's receipt and marks its order paid with a refunded payment."""

HAND_OUT_KEEPS_RETRY = "hand-out-keeps-retry"
"""Sabotage: handing a failure to another execution does not revoke its sender's retry
authorisation: the sender's retry re-sends the card another execution was declined on
and went past (to its backup), while that one pays there: two payments."""

LISTS_NOT_MASKED_ELEMENT_WISE = "lists-not-masked-element-wise"
"""Sabotage (design: R17): a field path that meets a list looks for the field name among the
list's indexes, finds none, and stores every element in clear."""

KEY_COMPONENTS_NOT_ESCAPED = "key-components-not-escaped"
"""Components joined as they are, so a ':' in a tenant or key can make two calls one
(design: R21)."""

PSEUDONYM_KEY_WHITESPACE_ACCEPTED = "pseudonym-key-whitespace-accepted"
"""Sabotage (design: A8): a pseudonym key with surrounding whitespace is used as it is, so a
worker whose key came from a file with its trailing newline computes other
fingerprints and handles than the others."""

LEASE_CHECK_IN_SEPARATE_ROUND_TRIP = "lease-check-in-separate-round-trip"
"""The lease is checked in a round trip of its own, not in the writing transaction
(design: PS4)."""

RENEW_REVIVES_EXPIRED_LEASE = "renew-revives-expired-lease"
"""A renewal revives a lease that already expired (design: R19)."""

EXPIRY_BY_CALLER_CLOCK = "expiry-by-caller-clock"
"""A lease's expiry is judged by the caller's clock, not the database's (design: PS13)."""

HOLDER_TRUSTS_LEASE_FOREVER = "holder-trusts-lease-forever"
"""The holder trusts its lease for ever, never checking its own clocks (design: PS13)."""

ROLLED_BACK_SETTLE_MOVES_HOLDER_DEADLINE = "rolled-back-settle-moves-holder-deadline"
"""A one-statement settle that failed whole on its history row's ``(key, seq)`` — its lease
extension rolled back with it — still moves the holder's deadline (design: holder deadline):
the holder trusts its lease longer than the database keeps it."""

FENCE_NOT_RECHECKED_AT_COMMIT = "fence-not-rechecked-at-commit"
"""The fence is not checked again at the commit (design: P1)."""

ONE_STATEMENT_WITHOUT_FENCE = "one-statement-without-fence"
"""A one-statement transition's compare-and-set does not join the lease check in the same
statement: a holder whose lease expired or was taken over changes the intent (design: P1)."""

FENCE_TIMED_BEFORE_LOCK_WAIT = "fence-timed-before-lock-wait"
"""The fence reads the clock before it waits for the lease row, not once it holds it: a
lease that expired while the fence waited (behind a long transaction of its holder) is
still taken for live, and the late holder writes (design: one round trip per state change)."""

LEASE_LOCK_WAITS = "lease-lock-waits"
"""A decision about another holder's lease waits for the lease row's lock instead of taking
a locked row for live: a start (or the sweep) holding the execution's row waits for the
lease row while the holder's claim holds it and waits for the execution's row, a
deadlock the server ends by failing one of them (design: one round trip per state change)."""

ONE_STATEMENT_START_UNLOCKED = "one-statement-start-unlocked"
"""The one-statement start checks that the execution may start on the statement's snapshot,
not on the row it locks: a cancel committed while it waited for the row is not seen, and
the cancelled execution runs (design: one round trip per state change)."""

ENGINE_COMMIT_CHECK_SKIPPED_PAST_ITS_BOUND = "engine-commit-check-skipped-past-its-bound"
"""An engine-only fenced transaction skips the commit's lease check however long it ran,
not only while it ended well inside the lease it extended (design: P1)."""


# The store (store/) and its migrations.

LEASE_DECISION_ON_COMMITTED_READ = "lease-decision-on-committed-read"
"""Sabotage (design: another holder's lease): decide about another holder's lease from its last
committed row, as a plain read sees it, instead of under its row lock."""

RELEASE_LOCKS_EXECUTION_FIRST = "release-locks-execution-first"
"""Sabotage (design: one round trip per state change): a delivery's release locks the
execution's row and then waits for the lease row, against the one lock order: a claim of
another thread of the delivery, holding the lease row and waiting for the execution's,
deadlocks with it, and the server fails one of them."""

SQLITE_FORK_UNGUARDED = "sqlite-fork-unguarded"

PLANNED_WAITS_COUNTED = "planned-waits-counted"
"""Sabotage (design: recovery cap): every re-publish of a waiting execution counts toward the
recovery cap, the planned end of a long wait or an answered pause too."""

RESOLVE_REDRIVES_CREATOR_ONLY = "resolve-redrives-creator-only"
"""Sabotage (design: waiters re-driven): settling an intent sends on only the execution that created
it; another that took it over and waits for an operator waits for ever."""

STARTED_EXECUTIONS_EXPIRE = "started-executions-expire"
"""Sabotage (design: expires bounds the start): ``expires`` ends a waiting execution
that already started (and charged), not only one no delivery started."""

UNDO_REFUNDS_COUNTED_AS_PAYMENTS = "undo-refunds-counted-as-payments"
"""Sabotage (design: compensated step): the refunds an execution's undos made
count as payments it left behind: a failure whose undo refunded the charge is listed,
and alerted on, as "failed after a payment", with the refund shown as the payment."""

EXPIRY_DECIDED_BY_LISTING = "expiry-decided-by-listing"
"""Sabotage (design: expires bounds the start): the sweep expires what its listing found
never started, without asking again under the row lock: a delivery that started it in
between, charged and then waits is expired with the customer charged."""

PAUSE_ANSWER_WITHOUT_COMPARE_AND_SET = "pause-answer-without-compare-and-set"
"""Sabotage (design: PS11): an answer is an unconditional update of the pause and its
execution, whatever either's state: a second answer also "wins", and one that comes
after the execution completed runs it again from the pause on."""

PAUSE_WRITTEN_OVER_AN_EARLY_ANSWER = "pause-written-over-an-early-answer"
"""Sabotage (design: early answers): the pause is written without reading, under the
execution row's lock, whether an answer came first: an early answer is overwritten by
the pending pause, its answerer was told it was kept, and the execution waits for an
answer that already came."""

PENDING_INTENT_NARROW = "pending-intent-narrow"
"""Sabotage (design: pending intent): count an intent as the execution's only while nobody else
holds it (the old definition), so one the sweep holds for its lookup is not counted."""

PENDING_INTENT_BY_CREATOR = "pending-intent-by-creator"
"""Sabotage (design: pending intent): count an intent as the execution's when it created or
holds it, not when it sent the attempt on the wire (design: who sent), so a charge one
click re-sent for another's intent is nobody's while the sweep looks it up."""

AUDIT_AFTER_THE_CHANGE = "audit-after-the-change"
"""Sabotage: an operator's audit row is written after the change, in a transaction of its
own (``operator.acting`` then appends it): a crash, or a failure of that write, leaves a
change nobody can trace to a person."""

TASK_NAME_NOT_CHECKED = "task-name-not-checked"
"""Sabotage (design: one task per id): a delivery of another task under an execution's id is treated
as that execution (the charge's receipt returned to a refund)."""

TENANT_MINTED_WHILE_IN_USE = "tenant-minted-while-in-use"
"""Sabotage (revision 0007): a store upgraded while it holds executions gets a new id
anyway, so a delivery after the upgrade computes another key for a payment sent
before it, and the gateway cannot tell the resend from a new charge."""

RECORD_USES_IGNORED_BY_RETENTION = "record-uses-ignored-by-retention"
"""Sabotage (design: retention): retention follows the creating execution only, so a record
another execution replayed is deleted while that one still waits."""

PAUSED_RECORDS_EXPIRE = "paused-records-expire"
"""Sabotage (pauses): retention counts a paused execution idle past the cutoff as done,
so the intents and fenced effects before its pause go while it waits for its answer."""

RETENTION_DELETES_WHAT_IT_LISTED = "retention-deletes-what-it-listed"
"""Sabotage (design: retention): retention deletes the records a plain read listed, its
deletes judging nothing but the status, and a replay reads and notes its use without
holding the record: a replay between the two relies on a record that is then deleted,
its use with it, and the replaying execution's re-run charges again."""

RELIANCE_OFF_THE_RECORD = "reliance-off-the-record"
"""Sabotage: a reliance is noted beside the record, not by a compare-and-set on it, and an
undo's claim does not compare the reliance it read: a replay and an undo that race both
win — the second click gets the receipt of a charge the first click refunds."""

FENCED_TRANSACTION_IDLE_UNBOUNDED = "fenced-transaction-idle-unbounded"
"""Sabotage (design: PS3), on PostgreSQL: a holder frozen inside a fenced transaction keeps its
session, and with it the lock on its lease row, for as long as it stays frozen, so no
other worker can decide on that lease and the payment stalls."""


# One delivery (delivery/) and the task (task.py).

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

WAKE_FOLDED_INTO_REFUSED_RETRY = "wake-folded-into-refused-retry"
"""Sabotage: a deferred duplicate's wake is cleared into a retry that Celery then refuses
(past max_retries), so no message carries the continuation."""

REQUEUE_WITHOUT_PAUSE = "requeue-without-pause"
"""Sabotage: a message handed back to the broker because the store is down is
redelivered at once, over and over, for as long as the outage lasts."""

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


# What the Celery layer records around a delivery: publishes, held messages, the outbox, undo tasks.

HELD_NOT_REPORTED = "held-messages-not-reported"
"""Sabotage: a worker never says which messages it holds unstarted; killed, they wait
for ``agboss_requested_grace`` (Redis hides them for its visibility timeout)."""

LINK_IDS_NOT_FIXED = "link-ids-not-fixed"
"""Sabotage (design: publishes from a body): an execution's unfrozen links get a new id
each time a delivery sends them, so a duplicate that replays them starts a second execution."""

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


# The sweep (sweep/) and the operator's verbs (operator/).

OPERATOR_RESULT_UNCHECKED = "operator-result-unchecked"
"""Sabotage: ``resolve --completed`` stores whatever JSON it is given (a bare charge id
pasted from the dashboard); the next delivery replays it into a body that expected the
receipt, and fails there."""

SWEEP_WITHOUT_TICK = "sweep-without-tick"
"""Sabotage (design: trap 10): every beat's sweep runs, even when another already ran this tick."""

STRANDED_NOT_RECONCILED = "sweep-stranded-not-reconciled"
"""Sabotage (design: sweep reconciles): the sweep leaves a dead holder's PENDING intent to the next
delivery; with that delivery's reconcile-first also off, a charge is sent again."""

REDRIVE_WITHOUT_CLAIM = "sweep-redrive-without-claim"
"""Sabotage (design: trap 10): re-publish what the listing found without the compare-and-set
claim, so two sweepers publish one execution twice."""


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


# Tracing (core.tracing).

TRACE_ATTRIBUTES_UNFILTERED = "trace-attributes-unfiltered"
"""Sabotage (design: tracing): a span event carries every field of its log event, not the
allow-listed ones: a step's idempotency key (and any text a field holds) is exported to
whoever collects the traces."""


# Sealed at rest (core.sealing, store.rotation).

SEALED_WITHOUT_ROW_BINDING = "sealed-without-row-binding"
"""Sabotage (design: sealed at rest): a value is sealed bound to nothing but its key id,
so a sealed value copied from another row (another customer's card request, another
execution's answer) opens there as if it were that row's own."""

RESEAL_WITHOUT_COMPARE_AND_SET = "reseal-without-compare-and-set"
"""Sabotage (design: sealed at rest): ``agboss rotate-keys`` reads a batch, then writes each
re-sealed value over whatever the row holds by then: a result a worker settled in between
is replaced by the old, re-sealed, value."""

ALL: frozenset[str] = frozenset(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)
)
"""Every switch name above: what ``sabotage.switched_off`` accepts."""
