from __future__ import annotations

import django.db.models
from django.db import migrations

import django_idempotent_tasks.models
from django_idempotent_tasks.migrations._operations import AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_idempotent_tasks", "0006_outbox"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="idempotencyrecord",
            index=django_idempotent_tasks.models.PostgresPartialIndex(
                fields=["status", "task_name", "created_at"],
                name="django_idempotent_pending_idx",
                where=django.db.models.Q(("status", "PENDING")),
            ),
        ),
    ]
