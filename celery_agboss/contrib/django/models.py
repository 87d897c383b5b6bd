"""The store's tables as the admin reads them: unmanaged models (the store's Alembic
revisions own the tables; Django never creates, alters or writes them).

Only the columns the admin lists are mapped: a task's arguments, its result and a
pause's payload are not, so no page can show what the masking policy never saw. A
pause's page shows its payload all the same, read through the operator API
(``read_pause``: opened when the store is sealed): whoever answers it approves what it
asks.
The admin's actions change nothing through these models: they call the operator API,
which checks leases, compares and sets, and writes the audit trail.
"""

from __future__ import annotations

from django.db import models

_KEY = 512
_NAME = 200


class Execution(models.Model):  # type: ignore[misc]  # Django ships no types
    id = models.CharField(max_length=_KEY, primary_key=True)
    task_name = models.CharField(max_length=_NAME)
    state = models.CharField(max_length=32)
    reason = models.TextField(null=True)
    recovery_count = models.IntegerField()
    deliveries = models.IntegerField()
    requested_at_ms = models.BigIntegerField()
    terminal_at_ms = models.BigIntegerField(null=True)
    updated_at_ms = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = "agboss_executions"
        default_permissions = ("view",)
        permissions = [
            ("cancel_execution", "Can cancel an execution"),
            ("unpark_execution", "Can unpark a parked execution"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} {self.id}"


class Intent(models.Model):  # type: ignore[misc]
    idempotency_key = models.CharField(max_length=_KEY, primary_key=True)
    execution_id = models.CharField(max_length=_KEY)
    name = models.CharField(max_length=_NAME)
    status = models.CharField(max_length=16)
    attempt = models.IntegerField()
    needs_operator = models.BooleanField()
    gateway_transaction_id = models.CharField(max_length=256, null=True)
    first_attempt_at_ms = models.BigIntegerField(null=True)
    completed_at_ms = models.BigIntegerField(null=True)

    class Meta:
        managed = False
        db_table = "agboss_outbound_calls"
        default_permissions = ("view",)
        permissions = [("resolve_intent", "Can resolve an intent checked at the gateway")]

    def __str__(self) -> str:
        return str(self.idempotency_key)


class Pause(models.Model):  # type: ignore[misc]
    id = models.CharField(max_length=800, primary_key=True)
    execution_id = models.CharField(max_length=_KEY)
    name = models.CharField(max_length=_NAME)
    status = models.CharField(max_length=16)
    created_at_ms = models.BigIntegerField()
    answered_at_ms = models.BigIntegerField(null=True)

    class Meta:
        managed = False
        db_table = "agboss_pauses"
        default_permissions = ("view",)
        permissions = [("answer_pause", "Can answer a pause")]

    def __str__(self) -> str:
        return str(self.id)
