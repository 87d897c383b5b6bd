"""The engine's protections that tests switch off (``celery_agboss.core.sabotage``).

Each name is one check of the outbound-call state machine, the fenced effects or the
execution context. A guarantee test proves its protection by switching it off in a
twin and counting the harm at the fake gateway. None of these is ever a setting.
"""

from __future__ import annotations

from celery_agboss.core.sabotage import register

INTENT_CAS_WITHOUT_PREDICATE = register("intent-cas-without-predicate")
"""R15: a compare-and-set that misses writes anyway (an UPDATE without its predicate)."""

JOIN_ON_ANY_FINGERPRINT = register("join-on-any-fingerprint")
"""R16: join a send in flight whatever request the joiner asked for."""

RELEASE_WITH_UNSETTLED_ATTEMPT = register("release-with-unsettled-attempt")
"""R18/R23: release the lease while a send under it is still running."""

NO_KEY_AGE_CHECK = register("no-key-age-check")
"""R26/PS17: resend a ``NotSent()`` whatever the key's age."""

UNKNOWN_ERRORS_ARE_DEFINITE = register("unknown-errors-are-definite")
"""R25/PS1: every exception from send is a definite failure (FAILED, resent, no lookup)."""

RECLAIM_BUMPS_TOKEN = register("reclaim-bumps-token")
"""R23: after a send overran, the holder re-acquires its lease (token + 1) and carries on,
so its own send, still running, looks dead to everyone else."""

FINGERPRINT_NOT_CHECKED = register("fingerprint-not-checked")
"""PS7/PS20/PS22: another request under the same key is replayed, resent or reconciled."""

REPLAY_NOT_STORED_MARKER = register("replay-not-stored-marker")
"""R24: a replay of a result that could not be stored returns the marker as the result."""

SUPERSEDED_SILENTLY_REPORTED = register("superseded-silently-reported")
"""R20: an answer whose attempt was handed over is returned as if it had been stored."""

SEND_WITHOUT_LEASE_CHECK = register("send-without-lease-check")
"""PS3: send without checking the lease on the holder's clocks first."""

PENDING_RESENT_WITHOUT_RECONCILE = register("pending-resent-without-reconcile")
"""PS5: a pending intent is sent again (a new attempt) without asking reconcile first."""

LIVE_OWNER_TAKEN_OVER = register("live-owner-taken-over")
"""PS8: a pending intent whose owner's lease is live (a send in flight in another
execution) is taken over and reconciled as if its owner were dead."""

SEND_NOT_BOUNDED = register("send-not-bounded")
"""R22: wait for a send however long it takes."""

COMMIT_INSIDE_FENCED_EFFECT_ALLOWED = register("commit-inside-fenced-effect-allowed")
"""P2: a fenced effect's function may commit its own writes before the effect's record."""

CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY = register("caught-signal-does-not-stop-delivery")
"""A body that catches an unknown outcome and calls again gets a new step key: a second
charge. With the protection, every later verb of that delivery raises the signal again."""

INTERRUPTED_SEND_STOPS_RENEWING = register("interrupted-send-stops-renewing")
"""R18/R23: a wait interrupted while its send is on the wire (KeyboardInterrupt, a soft
time limit) stops renewing the lease at once, so it can expire and be taken over, and
the payment looked up (and sent again) while the first send may still reach the gateway."""


PASSED_FAILURE_RESENT = register("passed-failure-resent")
"""DESIGN §4 claim step 1: a definite failure is sent again by any execution that
reaches it, with no retry authorisation: the re-run of a body that went past it (it
caught the decline and charged a backup card), or a second click on the same order,
charges the first card too."""

DIVERGENCE_COMPLETED = register("divergence-completed")
"""DESIGN §4: a re-run whose body no longer reaches an intent an earlier delivery
created (it took another branch) completes anyway, hiding a payment that may exist."""

CANCEL_NOT_CHECKED_MID_BODY = register("cancel-not-checked-mid-body")
"""DESIGN §2.2: a cancel requested while the body runs (a revoke without terminate) is
not looked at by its next outbound() or fenced_effect(): the charge still goes out."""

RECORD_USE_NOT_NOTED = register("record-use-not-noted")
"""DESIGN §6.3: an execution that replays (or joins, or takes over) another execution's
intent or fenced effect is not noted as its user, so retention follows the creator only
and deletes a record a waiting execution still relies on."""

FENCED_EFFECT_NOT_REPLAYED = register("fenced-effect-not-replayed")
"""P2: a re-run does not replay a fenced effect's record: it runs ``fn`` again, so the
app's write goes in twice (or its own constraint refuses it and the paid order fails)."""

SQLITE_LONG_TRANSACTION_NOT_INTERRUPTED = register("sqlite-long-transaction-not-interrupted")
"""DESIGN §5: on SQLite a fenced transaction may hold the single write lock as long as its
code runs, so every other execution's lease renewal waits behind it and their leases lapse."""

STORE_FAILURE_CATCHABLE = register("store-failure-catchable")
"""DESIGN §2.2: a store failure inside outbound() or fenced_effect() reaches the body as an
ordinary exception, so a body's ``except Exception`` fallback (another card) runs while
the first payment may exist."""

STORED_ERROR_UNMASKED = register("stored-error-unmasked")
"""R17: the execution's stored failure keeps the exception's text and arguments as they
are, a decline quoting the card number included."""

REQUEST_STORED_UNMASKED = register("request-stored-unmasked")
"""R17: the intent stores the request as given, ignoring the call's masking policy."""

__all__ = [
    "CANCEL_NOT_CHECKED_MID_BODY",
    "CAUGHT_SIGNAL_DOES_NOT_STOP_DELIVERY",
    "COMMIT_INSIDE_FENCED_EFFECT_ALLOWED",
    "DIVERGENCE_COMPLETED",
    "FENCED_EFFECT_NOT_REPLAYED",
    "FINGERPRINT_NOT_CHECKED",
    "INTENT_CAS_WITHOUT_PREDICATE",
    "INTERRUPTED_SEND_STOPS_RENEWING",
    "JOIN_ON_ANY_FINGERPRINT",
    "NO_KEY_AGE_CHECK",
    "PASSED_FAILURE_RESENT",
    "PENDING_RESENT_WITHOUT_RECONCILE",
    "RECLAIM_BUMPS_TOKEN",
    "RECORD_USE_NOT_NOTED",
    "RELEASE_WITH_UNSETTLED_ATTEMPT",
    "REPLAY_NOT_STORED_MARKER",
    "REQUEST_STORED_UNMASKED",
    "SEND_NOT_BOUNDED",
    "SEND_WITHOUT_LEASE_CHECK",
    "SQLITE_LONG_TRANSACTION_NOT_INTERRUPTED",
    "STORED_ERROR_UNMASKED",
    "STORE_FAILURE_CATCHABLE",
    "SUPERSEDED_SILENTLY_REPORTED",
    "UNKNOWN_ERRORS_ARE_DEFINITE",
]
