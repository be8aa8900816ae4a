from __future__ import annotations

import django.db.models
from django.db import migrations

from django_idempotent_tasks.migrations._operations import (
    AddIndexConcurrentlyOnPostgres,
    RemoveIndexConcurrentlyOnPostgres,
)


class Migration(migrations.Migration):
    # CREATE and DROP INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_idempotent_tasks", "0007_pending_index"),
    ]

    # The new index first: the status command's expired count and the purge keep an index meanwhile.
    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="idempotencyrecord",
            index=django.db.models.Index(fields=["expires_at", "id"], name="django_idempotent_expiry_idx"),
        ),
        RemoveIndexConcurrentlyOnPostgres(
            model_name="idempotencyrecord",
            name="django_idempotent_expires_idx",
        ),
    ]
