"""``manage.py purge_idempotency_records``: delete expired records in short batches."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone
from django.utils.translation import ngettext

from django_idempotent_tasks import purging, store
from django_idempotent_tasks.management import options


class Command(BaseCommand):
    help = "Delete idempotency records past their expiry, in batches; records with a live lease are kept."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=options.duration,
            metavar="AGE",
            help="Delete records created more than AGE ago (7d, 12h or 30m), expired or not. "
            "Default: records past their expires_at.",
        )
        parser.add_argument(
            "--status",
            type=options.purgeable_status,
            help="Only records with this status: IN_PROGRESS, SUCCEEDED or FAILED (PENDING records are never purged). Default: any of those.",
        )
        parser.add_argument(
            "--task",
            type=options.non_empty,
            metavar="NAME",
            help="Only records of the task with this name. Default: every task.",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count the records that would be deleted and delete nothing. Default: off.",
        )
        parser.add_argument(
            "--batch-size",
            type=options.positive_int,
            default=1000,
            metavar="N",
            help="Records deleted per transaction. Default: 1000.",
        )

    def handle(
        self,
        *,
        older_than: timedelta | None,
        status: str | None,
        task: str | None,
        dry_run: bool,
        batch_size: int,
        verbosity: int,
        **extra: Any,
    ) -> None:
        if older_than is None:
            queryset = store.records().expired()
        else:
            queryset = store.records().filter(created_at__lt=timezone.now() - older_than)
        if status is not None:
            queryset = queryset.filter(status=status)
        if task is not None:
            queryset = queryset.filter(task_name=task)

        if dry_run:
            count = purging.purgeable(queryset).count()
        else:
            progress = self._progress(queryset) if verbosity >= 1 and self.stdout.isatty() else None
            count = purging.purge(queryset, batch_size=batch_size, progress=progress)
            if progress is not None and count:
                self.stdout.write("")
        if verbosity >= 1:
            self.stdout.write(self._summary(count, dry_run))

    def _progress(self, queryset: Any) -> Any:
        total = purging.purgeable(queryset).count()

        def show(deleted: int) -> None:
            self.stdout.write(f"\rDeleted {deleted:,} of {total:,} records…", ending="")
            self.stdout.flush()

        return show

    def _summary(self, count: int, dry_run: bool) -> str:
        if count == 0:
            return "No records to delete."
        if dry_run:
            text = ngettext("Would delete %(count)s record.", "Would delete %(count)s records.", count)
        else:
            text = ngettext("Deleted %(count)s record.", "Deleted %(count)s records.", count)
        return text % {"count": f"{count:,}"}
