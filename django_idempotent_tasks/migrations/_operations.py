"""Index operations built concurrently on PostgreSQL, so that claims go on meanwhile.

InnoDB builds and drops a secondary index online by itself; SQLite locks the file while it builds.
django.contrib.postgres is imported only on PostgreSQL: it needs a PostgreSQL driver. (A module
whose name starts with "_" is not a migration to Django's loader.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import migrations


class _ConcurrentlyOnPostgres:
    """The operation as django.contrib.postgres's ``postgres_operation`` on PostgreSQL, as itself
    elsewhere. Its migration must set ``atomic = False``: PostgreSQL builds and drops an index
    concurrently only outside a transaction."""

    postgres_operation = ""
    if TYPE_CHECKING:  # each operation's own arguments

        def _postgres_arguments(self) -> tuple[Any, ...]: ...

    def _operation(self, schema_editor: Any) -> Any:
        if schema_editor.connection.vendor != "postgresql":
            return super()
        from django.contrib.postgres import operations

        return getattr(operations, self.postgres_operation)(*self._postgres_arguments())

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        self._operation(schema_editor).database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        self._operation(schema_editor).database_backwards(app_label, schema_editor, from_state, to_state)


class AddIndexConcurrentlyOnPostgres(_ConcurrentlyOnPostgres, migrations.AddIndex):
    """AddIndex, built by AddIndexConcurrently on PostgreSQL."""

    postgres_operation = "AddIndexConcurrently"

    def _postgres_arguments(self) -> tuple[Any, ...]:
        return (self.model_name, self.index)


class RemoveIndexConcurrentlyOnPostgres(_ConcurrentlyOnPostgres, migrations.RemoveIndex):
    """RemoveIndex, dropped by RemoveIndexConcurrently on PostgreSQL."""

    postgres_operation = "RemoveIndexConcurrently"

    def _postgres_arguments(self) -> tuple[Any, ...]:
        return (self.model_name, self.name)
