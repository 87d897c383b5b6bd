"""The switches of the store (``celery_agboss.store``), its migrations and sealing at
rest. Read through ``celery_agboss.core.protections``, their one home."""

from __future__ import annotations

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

CANCEL_SKIPS_EFFECT_UNDOS = "cancel-skips-effect-undos"
"""Sabotage (design: cancel request): a cancel counts only the execution's payments: one
that debited the customer's wallet with a fenced effect and declared its undo (credit it
back), cancelled while it waits, ends ``CANCELLED`` at once with the debit kept and its
undo never run; so does one stopped part-way through its undos, its remaining fenced
effects' undos dropped."""

PAYMENTS_HANDLED_SKIPS_EFFECT_UNDOS = "payments-handled-skips-effect-undos"
"""Sabotage (design: cancel request, operator decisions): ``cancel --payments-handled``
ends the cancel at once, whatever undos are left: one whose body debited the customer's
wallet with a fenced effect and declared its credit back ends ``CANCELLED`` with the debit
kept, the operator having dealt only with its payments at the gateway."""

PAYMENTS_HANDLED_SKIPS_MONEYLESS_UNDOS = "payments-handled-skips-moneyless-undos"
"""Sabotage (design: cancel request, operator decisions): ``--payments-handled`` reads
every outbound step as a payment, a call declared ``moves_money=False`` too: a stock hold
placed through an inventory service's API is never released after the operator's word."""

PAYMENTS_HANDLED_RUNS_PAYMENT_UNDOS = "payments-handled-runs-payment-undos"
"""Sabotage (design: cancel request, operator decisions): the compensating delivery ignores
``payments_handled_at_ms`` and runs every undo left: after the gateway declined the
refund's undo and the operator refunded the card by hand and confirmed with
``cancel --payments-handled``, the refund is sent to the gateway a second time."""

PAYMENTS_HANDLED_DROPPED_WHILE_RUNNING = "payments-handled-dropped-while-running"
"""Sabotage (design: cancel request, operator decisions): ``cancel --payments-handled`` of
an execution a delivery took the lease of (or that got a pending intent) after the
verb's checks keeps the cancel request and drops the flag, reported "cancel requested":
the request's end then runs the refund's undo the operator made by hand."""

PAYMENTS_HANDLED_STEP_UNCLAIMED = "payments-handled-step-unclaimed"
"""Sabotage (design: cancel request, operator decisions): ``cancel --payments-handled``
that ends at once leaves its payment steps unclaimed: a later click replays the charge
the operator refunded by hand as paid."""

PAYMENTS_HANDLED_SKIPS_UNDECLARED_CHARGES = "payments-handled-skips-undeclared-charges"
"""Sabotage (design: cancel request, operator decisions): ``cancel --payments-handled``
claims only the payments that declared an undo: a charge that declared none stays
unclaimed, and a later click on the same order replays the charge the operator refunded
by hand as paid."""

PAYMENTS_HANDLED_SKIPS_RELIED_CHARGES = "payments-handled-skips-relied-charges"
"""Sabotage (design: cancel request, operator decisions): ``--payments-handled`` (the
cancel or the verb) claims only the charges the execution sent: one it relied on, sent by
another execution that ended without claiming it, stays unclaimed, and after the refund by
hand a later click on the same order is handed it as paid (goods shipped)."""

PAYMENTS_HANDLED_CLAIMED_AFTER_UNDOS = "payments-handled-claimed-after-undos"
"""Sabotage (design: cancel request, operator decisions): ``cancel --payments-handled``
of an execution whose fenced effects' undos must run first (``COMPENSATING``) claims its
payments only once they ran: a later click meanwhile is handed the charge the operator
refunded by hand as paid."""

HANDLED_CLAIMER_COVERS = "handled-claimer-covers"
"""Sabotage (design: cancel request, operator decisions): a claimer whose payment an
operator dealt with by hand (``cancel --payments-handled``: its undos of it never run)
still covers another execution's undos of the step: that one, failing after it relied on
the charge, runs nothing and is listed nowhere (a refund owed, nobody told)."""

PAYMENTS_HANDLED_VERB_CLAIMS_NOTHING = "payments-handled-verb-claims-nothing"
"""Sabotage (design: cancel request, operator decisions): ``agboss payments-handled`` of a
``FAILED`` or ``CANCELLED`` execution only sets its flag: the charge the operator refunded
by hand stays unclaimed, a later click on the same order is handed it as paid (goods
shipped) and its undo refunds it a second time."""

PAYMENTS_HANDLED_DELIVERY_CLAIMS_NEW_CHARGES = "payments-handled-delivery-claims-new-charges"
"""Sabotage (design: cancel request, operator decisions): the delivery that ends a
``cancel --payments-handled`` after its fenced effects' undos claims every charge the word
would cover now, also one it relied on whose sender was live at the word (left out then)
and is undoing now, not claimed yet: the sender's own refund is skipped (``NOT_COVERED``)
and it waits for a person, told a person dealt with a payment nobody dealt with."""

PAYMENTS_HANDLED_WHILE_ANOTHER_USES = "payments-handled-while-another-uses"
"""Sabotage (design: cancel request, operator decisions): ``cancel --payments-handled`` is
accepted while a later click still uses the charge: the charge is claimed, yet that
click, re-delivered, is handed the charge the operator refunded by hand as paid."""

PAYMENTS_HANDLED_WHILE_UNDO_TASK_QUEUED = "payments-handled-while-undo-task-queued"
"""Sabotage (design: cancel request, operator decisions): ``cancel --payments-handled`` is
accepted while a refund's undo task of the execution is published and not ended: the
operator refunds by hand, and the queued task refunds again."""

UNDO_TASKS_FOUND_BY_OUTBOX_ONLY = "undo-tasks-found-by-outbox-only"
"""Sabotage (design: cancel request, retention): ``cancel --payments-handled`` looks for the
execution's undo tasks through its outbox rows alone: once retention deleted them, a task
still queued, paused or waiting is not seen, and it refunds after the operator's refund."""

REVOKED_UNDO_TASK_NOT_RECORDED = "revoked-undo-task-not-recorded"
"""Sabotage (design: cancel request, operator decisions): a revoke of an undo's task its
publisher did not record records nothing: its outbox row reads queued until retention,
and every ``cancel --payments-handled`` of its parent is refused meanwhile."""

EXPIRY_BY_THE_WORKERS_CLOCK = "expiry-by-the-workers-clock"
"""Sabotage (design: expires bounds the start): a worker that holds a message past its
``expires`` by its own clock ends a never-started execution EXPIRED whatever the
database's clock says: a worker whose clock runs ahead drops a payment with time left."""

EXPIRY_DECIDED_BY_LISTING = "expiry-decided-by-listing"
"""Sabotage (design: expires bounds the start): the sweep expires what its listing found
never started, without asking again under the row lock: a delivery that started it in
between, charged and then waits is expired with the customer charged."""

PAUSE_ANSWER_WITHOUT_COMPARE_AND_SET = "pause-answer-without-compare-and-set"
"""Sabotage (design: PS11): an answer is an unconditional update of the pause and its
execution, whatever either's state: a second answer also "wins", and one that comes
after the execution completed runs it again from the pause on."""

UNDO_PAUSE_TAKEN_FOR_THE_BODYS = "undo-pause-taken-for-the-bodys"
"""Sabotage (design: compensating): a pause inside an undo is taken for one of the body's:
a cancel request refuses its answer, an operator's cancel is accepted, and the sweep's
cancel step moves it back to ``COMPENSATING``, whose undo pauses again, until the
recovery cap: the customer waiting for the refund is never refunded."""

BODY_CLAIM_AFTER_THE_START_MARK = "body-claim-after-the-start-mark"
"""Sabotage (design: compensating): the claim of the body's call reads the cancel request
only, not whether the compensation started: a thread of the body that passed the
delivery's own check just before the start mark claims and charges just after it, and
that charge, made after the mark, is counted as an undo's refund, listed nowhere."""

UNDO_TASK_CANCEL_ENDS_CANCELLED = "undo-task-cancel-ends-cancelled"
"""Sabotage (design: undo once): an undo's task (a signature its parent's undo published)
revoked before its refund ends ``CANCELLED`` like any task: its parent reads undone, the
charge stays unrefunded, and no listing names either to a person."""

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

REUSED_ID_OTHER_ARGS_ACCEPTED = "reused-id-other-args-accepted"
"""Sabotage (design: one task per id): a fresh publish of other arguments under an id
already recorded is accepted as that execution: its caller is handed the first
request's receipt, and its own order is never charged."""

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

RETENTION_DELETES_UNHANDLED_PAYMENTS = "retention-deletes-unhandled-payments"
"""Sabotage (design: retention): retention deletes the records and the row of an execution
that failed after a payment nobody dealt with, once past the cutoff: ``agboss pending``
and its gauge stop listing it, and the charged customer is never refunded."""

UNSENT_LINKS_CAPPED_BY_WHOLE_LIFE = "sweep-unsent-links-capped-by-whole-life"
"""Sabotage (design: unsent links, recovery cap): the links step lists only executions
under the recovery cap counted over their whole life, so one that completed at the cap
(its message re-driven that often) never has its links sent: paid, never shipped."""

RETENTION_DELETES_A_REPUBLISHED_EXECUTION = "retention-deletes-a-republished-execution"
"""Sabotage (design: retention, unsent links): retention deletes a terminal execution the
sweep has just re-published (its ``not_before`` within the last grace): the message finds
no row, runs the body again and charges again."""

RETENTION_FORGETS_PUBLISHED_CHILDREN = "retention-forgets-published-children"
"""Sabotage (design: retention): retention deletes the row of an execution a body
published while that body may still run again (its execution paused, waiting): the
re-run publishes the same derived id, finds no row, and the child charges again."""

RELIANCE_OFF_THE_RECORD = "reliance-off-the-record"
"""Sabotage: a reliance is noted beside the record, not by a compare-and-set on it, and an
undo's claim does not compare the reliance it read: a replay and an undo that race both
win — the second click gets the receipt of a charge the first click refunds."""

FENCED_TRANSACTION_IDLE_UNBOUNDED = "fenced-transaction-idle-unbounded"
"""Sabotage (design: PS3), on PostgreSQL: a holder frozen inside a fenced transaction keeps its
session, and with it the lock on its lease row, for as long as it stays frozen, so no
other worker can decide on that lease and the payment stalls."""


# Sealed at rest (core.sealing, store.rotation).

SEALED_WITHOUT_ROW_BINDING = "sealed-without-row-binding"
"""Sabotage (design: sealed at rest): a value is sealed bound to nothing but its key id,
so a sealed value copied from another row (another customer's card request, another
execution's answer) opens there as if it were that row's own."""

RESEAL_WITHOUT_COMPARE_AND_SET = "reseal-without-compare-and-set"
"""Sabotage (design: sealed at rest): ``agboss rotate-keys`` reads a batch, then writes each
re-sealed value over whatever the row holds by then: a result a worker settled in between
is replaced by the old, re-sealed, value."""

ENCRYPTION_FLAG_SETTLED_BEFORE_COMMIT = "encryption-flag-settled-before-commit"
"""Sabotage (design: sealed at rest): a process with keys holds ``encryption`` = ``on``
settled as soon as it wrote the row in the transaction of its first seal: when that
transaction rolls back, the row is gone, the process never writes it again, and a
process without keys writes card data in clear into a store holding sealed values."""


# Retention and migrations against messages and workers still in flight.

RETENTION_DELETES_A_SCHEDULED_EXECUTION = "retention-deletes-a-scheduled-execution"
"""Sabotage (design: retention): retention deletes a terminal execution whose message the
broker still holds until its ETA (a scheduled charge cancelled before it): at the ETA the
message finds no row, runs the body and charges the customer who cancelled."""

TENANT_MINTED_FOR_AN_IDLE_STORE = "tenant-minted-for-an-idle-store"
"""Sabotage (revision 0007): a store that existed before the upgrade but holds nothing at
that moment gets a new id: a worker of the previous version, still running through a
rolling deploy, keys a payment with ``"default"``, this version's another key, and one
order is charged twice."""

RETENTION_ON_A_NEWER_STORE = "retention-on-a-newer-store"
"""Sabotage (design: retention): the sweep of a version older than its store (an old beat
left running) deletes by its own, older, keep rules: a row a newer version keeps for a
message still in the broker goes, and that message charges again."""
