from typing import Any

import django.db.models
from django.db import migrations

import django_idempotent_tasks.models


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    """AddIndex, built by AddIndexConcurrently on PostgreSQL so that claims go on meanwhile.

    InnoDB builds a secondary index online by itself; SQLite locks the file while it builds.
    django.contrib.postgres is imported only there: it needs a PostgreSQL driver.
    """

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            from django.contrib.postgres.operations import AddIndexConcurrently

            operation = AddIndexConcurrently(self.model_name, self.index)
            operation.database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            from django.contrib.postgres.operations import AddIndexConcurrently

            operation = AddIndexConcurrently(self.model_name, self.index)
            operation.database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("django_idempotent_tasks", "0004_attempt_history"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="idempotencyrecord",
            index=django_idempotent_tasks.models.PostgresPartialIndex(
                fields=["status", "id"],
                name="django_idempotent_status_idx",
                where=django.db.models.Q(("status__in", ["FAILED", "IN_PROGRESS"])),
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="idempotencyrecord",
            index=django.db.models.Index(fields=["created_at"], name="django_idempotent_created_idx"),
        ),
    ]
