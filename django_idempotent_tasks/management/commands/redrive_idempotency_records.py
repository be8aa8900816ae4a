"""``manage.py redrive_idempotency_records``: send again the messages of outbox tasks that never arrived."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import ngettext

from django_idempotent_tasks import outbox
from django_idempotent_tasks.conf import conf
from django_idempotent_tasks.management import options
from django_idempotent_tasks.models import IdempotencyRecord


class Command(BaseCommand):
    help = "Send again the stored message of PENDING records (outbox tasks) that no worker has claimed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=options.age,
            metavar="AGE",
            help="Send records PENDING for more than AGE (1h, 10m or 30s), counted from their "
            "message's ETA when it has one. Default: IDEMPOTENT_TASKS_REDRIVE_AFTER (600 s).",
        )
        parser.add_argument(
            "--limit",
            type=options.positive_int,
            metavar="N",
            help="Send at most N records, the oldest first. Default: every record due.",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="List the records that would be sent and send nothing. Default: off.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            dest="as_json",
            help="Print the records as JSON instead of a sentence. Default: off.",
        )

    def handle(
        self,
        *,
        older_than: timedelta | None,
        limit: int | None,
        dry_run: bool,
        as_json: bool = False,
        verbosity: int,
        **extra: Any,
    ) -> None:
        seconds = conf.REDRIVE_AFTER if older_than is None else int(older_than.total_seconds())
        done = _would_redrive(seconds, limit) if dry_run else outbox.redrive(seconds, limit)
        if as_json:
            sent = [_entry(record) for record in done.sent]
            self.stdout.write(json.dumps({"dry_run": dry_run, "count": len(sent), "records": sent}, indent=2))
        elif verbosity >= 1:
            self.stdout.write(self._summary(len(done.sent), dry_run))
        for unsent in done.unsent:
            self.stderr.write(f"Could not send {unsent.record} again: {unsent.error!r}")
        _fail_if_left_pending(done)

    def _summary(self, count: int, dry_run: bool) -> str:
        if count == 0:
            return "No records to send again."
        if dry_run:
            text = ngettext(
                "Would send %(count)s record again.", "Would send %(count)s records again.", count
            )
        else:
            text = ngettext("Sent %(count)s record again.", "Sent %(count)s records again.", count)
        return text % {"count": f"{count:,}"}


def _entry(record: IdempotencyRecord) -> dict[str, str]:
    return {"scope": record.scope, "key": record.key, "task": record.task_name, "task_id": record.task_id}


def _would_redrive(older_than: int, limit: int | None) -> outbox.Redriven:
    """What a re-drive would send, sending nothing."""
    due = outbox.redrivable(older_than, limit)
    return outbox.Redriven(due=len(due), sent=due)


def _fail_if_left_pending(done: outbox.Redriven) -> None:
    """A CommandError (a non-zero exit, for cron and CI) when a due record is still PENDING."""
    if done.broker_error is not None:
        raise CommandError(
            f"The broker refused a message ({done.broker_error!r}); {done.left_pending} left PENDING."
        )
    if done.unsent:
        count = len(done.unsent)
        text = ngettext(
            "%(count)s record could not be sent again; it is left PENDING.",
            "%(count)s records could not be sent again; they are left PENDING.",
            count,
        )
        raise CommandError(text % {"count": f"{count:,}"})
