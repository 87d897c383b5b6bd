"""The admin's models: unmanaged, over the tables 0001 made (no SQL runs here).

Their permissions (``view`` and one per decision: resolve, cancel, unpark, answer a
pause) are what this migration brings; Django creates them after ``migrate``.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no types
    dependencies = [
        ("agboss", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Execution",
            fields=[
                ("id", models.CharField(max_length=512, primary_key=True, serialize=False)),
                ("task_name", models.CharField(max_length=200)),
                ("state", models.CharField(max_length=32)),
                ("reason", models.TextField(null=True)),
                ("recovery_count", models.IntegerField()),
                ("deliveries", models.IntegerField()),
                ("requested_at_ms", models.BigIntegerField()),
                ("terminal_at_ms", models.BigIntegerField(null=True)),
                ("updated_at_ms", models.BigIntegerField()),
            ],
            options={
                "db_table": "agboss_executions",
                "permissions": [
                    ("cancel_execution", "Can cancel an execution"),
                    ("unpark_execution", "Can unpark a parked execution"),
                ],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="Intent",
            fields=[
                (
                    "idempotency_key",
                    models.CharField(max_length=512, primary_key=True, serialize=False),
                ),
                ("execution_id", models.CharField(max_length=512)),
                ("name", models.CharField(max_length=200)),
                ("status", models.CharField(max_length=16)),
                ("attempt", models.IntegerField()),
                ("needs_operator", models.BooleanField()),
                ("gateway_transaction_id", models.CharField(max_length=256, null=True)),
                ("first_attempt_at_ms", models.BigIntegerField(null=True)),
                ("completed_at_ms", models.BigIntegerField(null=True)),
            ],
            options={
                "db_table": "agboss_outbound_calls",
                "permissions": [("resolve_intent", "Can resolve an intent checked at the gateway")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="Pause",
            fields=[
                ("id", models.CharField(max_length=800, primary_key=True, serialize=False)),
                ("execution_id", models.CharField(max_length=512)),
                ("name", models.CharField(max_length=200)),
                ("status", models.CharField(max_length=16)),
                ("created_at_ms", models.BigIntegerField()),
                ("answered_at_ms", models.BigIntegerField(null=True)),
            ],
            options={
                "db_table": "agboss_pauses",
                "permissions": [("answer_pause", "Can answer a pause")],
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
