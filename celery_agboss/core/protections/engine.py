"""The switches of the engine (``celery_agboss.core``): the outbound-call state
machine, fenced effects, the lease, keys, undo, tracing. Read through
``celery_agboss.core.protections``, their one home."""

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

UNDO_INTENTS_FROM_DONE_MARKS_ONLY = "undo-intents-from-done-marks-only"
"""Sabotage (design: compensated step): the intents an execution's undos made are read from
their done marks only, which name what the run that wrote each one reached: an undo re-run
after a crash that finds its refund made (it read the gateway first) leaves that refund
counted as a payment the execution left behind, "refund it at the gateway"."""

BODY_CALLS_AFTER_COMPENSATION_START = "body-calls-after-compensation-start"
"""Sabotage (design: compensated step): a thread the body started may still call
``outbound()`` after the body failed and its undos started: it charges while they refund,
and that charge, made after the start mark, is counted as an undo's refund, listed nowhere.
Both refusals are off: the delivery's own check and its claim's
(``BODY_CLAIM_AFTER_THE_START_MARK`` switches off the claim's alone)."""

UNDO_PAUSES_SHARE_ONE_NAME = "undo-pauses-share-one-name"
"""Sabotage: a pause an undo makes is named as the body's would be, so two undos of one
function that ask a person (``approve-refund``) share one answer: the second refund is
decided by the answer about the first payment, kept or sent unasked."""

UNDO_CALLS_SHARE_ONE_KEY = "undo-calls-share-one-key"
"""Sabotage (design: undo once): every call an undo makes without a business key takes the
undo's key, whatever its position: the second of two partial refunds of one call replays
the first (one refund of 500 for a charge of 1000), or conflicts with it for ever."""

UNDO_IGNORES_OTHER_EXECUTIONS = "undo-ignores-other-executions"
"""Sabotage: an execution undoes a step it shares as if it were alone on it — the
refund of a charge another execution completed on (a paid, shipped order)."""

UNDO_COVERED_BY_OTHER_UNDOS = "undo-covered-by-other-undos"
"""Sabotage: a shared step another execution claimed for undo counts as undone for this
one whatever undos that one declared for it: a charge one task declared a refund for,
claimed by a task that only releases stock, is never refunded, both end ``FAILED``
with nobody told, and a later click is told it was undone and pays again."""

UNDO_TASK_READ_UNDONE_ON_PUBLISH = "undo-task-read-undone-on-publish"
"""Sabotage (design: compensated step): an undo declared as a Celery signature counts as
undone for the step's record once its task is published, not once that task refunded: a
later click is told the charge was undone while the refund is queued (or declined and
waiting for a person), pays again under a new attempt key, and the customer holds two
charges."""

UNDO_MARKS_READ_UNLOCKED = "undo-marks-read-unlocked"
"""Sabotage (design: compensated step): whoever finishes an undo of a step reads the
step's other undo marks without first holding the step's record row: a parent's last
undo and its undo's task committing at the same moment each miss the other's mark, the
record stays claimed for ever after the refund was made, and every later click on the
order is told "claimed for undo" and fails, with nothing listed for a person."""

UNDO_TASK_ACCEPT_WRITES_NO_MARK = "undo-task-accept-writes-no-mark"
"""Sabotage (design: compensated step): ``agboss accept`` of an undo's task that diverged
(it refunded, crashed, and its re-run found the refund made) ends it ``COMPLETED``
without the mark that its undo finished: the charge's record stays claimed for ever,
and every later click on the order fails, with nothing listed for a person."""

UNDO_TASK_MARK_NOT_KEPT = "undo-task-mark-not-kept"
"""Sabotage (design: retention, compensated step): the mark an undo's task wrote when it
completed is left to retention like any record of that terminal task, while its parent
still waits to finish its other undos (for a person): re-driven past the retention, the
parent finishes them, the mark is gone, and the charge's record stays claimed for ever
(every later click fails, nothing listed)."""

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


NOT_SENT_RESEND_UNBOUNDED = "not-sent-resend-unbounded"
"""Sabotage (design: key age): an intent settled as never sent (an operator's
``--not-sent``, a cancel's proof) is sent again under its key however old that key is:
past the gateway's retention, a resend is not deduplicated — two charges if it was sent."""

RECONCILE_READS_THIS_REQUEST = "reconcile-reads-this-request"
"""Sabotage (design: only the request's payment): a holder's reconcile of an intent that holds
another request asks about this delivery's request, not the stored one."""

MASKING_OVERLAP_BY_POSITION = "masking-overlap-by-position"
"""Sabotage (design: masking): a masking policy's check that nothing kept for reconcile is
masked compares paths segment by segment, blind to list positions: ``items.0.amount``
kept and ``items.amount`` masked passes, and reconcile reads ``***``."""

# Tracing (core.tracing).

TRACE_ATTRIBUTES_UNFILTERED = "trace-attributes-unfiltered"
"""Sabotage (design: tracing): a span event carries every field of its log event, not the
allow-listed ones: a step's idempotency key (and any text a field holds) is exported to
whoever collects the traces."""
