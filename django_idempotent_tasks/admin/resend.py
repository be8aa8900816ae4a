"""Send again (PENDING) and Run again (FAILED) for outbox records: a confirmation, a POST, a History entry."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _
from kombu.exceptions import OperationalError as BrokerError

from django_idempotent_tasks import outbox
from django_idempotent_tasks.admin.actions import log_entries
from django_idempotent_tasks.exceptions import OutboxError
from django_idempotent_tasks.models import IdempotencyRecord

if TYPE_CHECKING:
    from django_stubs_ext import StrPromise

    _ModelAdmin = admin.ModelAdmin[IdempotencyRecord]
else:
    _ModelAdmin = admin.ModelAdmin

logger = logging.getLogger("django_idempotent_tasks")
Status = IdempotencyRecord.Status


@dataclass(frozen=True)
class Resend:
    """One of the two ways to publish an outbox record's stored message again."""

    name: str  # also the outbox function that does it: outbox.send_again, outbox.run_again
    status: str
    title: StrPromise
    button: StrPromise
    warning: StrPromise
    done: StrPromise
    logged: str

    def applies_to(self, record: IdempotencyRecord) -> bool:
        """The record is in this way's status and holds the message to publish."""
        return record.status == self.status and record.message is not None


SEND_AGAIN = Resend(
    name="send_again",
    status=Status.PENDING,
    title=_("Send the message again?"),
    button=_("Yes, send it again"),
    warning=_(
        "This publishes the record's stored message again, under its own task id. If the first message "
        "was only late, a worker gets it twice: the second delivery replays or waits, the body runs once."
    ),
    done=_("Sent %(record)s again under its task id %(task_id)s."),
    logged="Sent again under task id {task_id}.",
)
RUN_AGAIN = Resend(
    name="run_again",
    status=Status.FAILED,
    title=_("Run the key again?"),
    button=_("Yes, run it again"),
    warning=_(
        "This puts the record back to PENDING with its attempts reset and publishes its stored message "
        "under a new task id: the task body runs again, as a retry would."
    ),
    done=_("%(record)s runs again under the new task id %(task_id)s: it is PENDING, its attempts reset."),
    logged="Ran again under the new task id {task_id} after {attempts} attempts: the record is PENDING.",
)
NO_MESSAGE = _(
    "No stored message: this key was not sent through the outbox (outbox=True), so it cannot be sent or "
    "run again from here. Its next delivery, if its message is still queued, runs it."
)


class ResendViews(_ModelAdmin):
    """``<pk>/send-again/`` and ``<pk>/run-again/``, and the same two as changelist actions."""

    def has_resend_permission(self, request: HttpRequest) -> bool:
        """The change permission: publishing a record again changes it (the admin edits nothing else)."""
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")

    def send_again_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._resend_view(request, object_id, SEND_AGAIN)

    def run_again_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._resend_view(request, object_id, RUN_AGAIN)

    @admin.action(description=_("Send again the selected PENDING records"), permissions=["resend"])
    def send_again_selected(self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]) -> None:
        self._resend_selected(request, queryset, SEND_AGAIN)

    @admin.action(description=_("Run again the selected FAILED records"), permissions=["resend"])
    def run_again_selected(self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]) -> None:
        self._resend_selected(request, queryset, RUN_AGAIN)

    def _publish(self, request: HttpRequest, record: IdempotencyRecord, how: Resend) -> str | None:
        """Publish ``record`` again and log it; None (and a message to the user) if nothing was sent."""
        attempts = record.attempts
        try:
            task_id: str = getattr(outbox, how.name)(record)
        except OutboxError as exc:
            # A worker claimed the key, or another operator acted, after the page read the record.
            self.message_user(
                request, gettext("Nothing was sent: %(reason)s") % {"reason": exc}, messages.WARNING
            )
            return None
        except (BrokerError, OSError) as exc:
            message = gettext(
                "The broker did not take the message of %(record)s (%(error)s): it is still PENDING, and the "
                "re-drive sends it once the broker is back."
            )
            self.message_user(request, message % {"record": record, "error": exc}, messages.ERROR)
            return None
        log_entries(
            request, CHANGE, how.logged.format(task_id=task_id, attempts=attempts), [(record.pk, str(record))]
        )
        logger.info(
            "Admin user %s: %s of %s (task id %s).", request.user.get_username(), how.name, record.pk, task_id
        )
        return task_id

    def _resend_view(self, request: HttpRequest, object_id: str, how: Resend) -> HttpResponse:
        if not self.has_resend_permission(request):
            raise PermissionDenied
        record = self.get_object(request, object_id)
        if record is None:
            raise Http404(gettext("No idempotency record with this id."))
        page = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[record.pk])
        if record.message is None:
            self.message_user(request, str(NO_MESSAGE), messages.WARNING)
            return HttpResponseRedirect(page)
        if record.status != how.status:
            message = gettext("%(record)s is %(status)s, not %(expected)s: nothing was changed.")
            expected = Status(how.status).label
            values = {"record": record, "status": record.get_status_display(), "expected": expected}
            self.message_user(request, message % values, messages.WARNING)
            return HttpResponseRedirect(page)
        # Only a POST carrying the confirmation page's "post" field publishes; CSRF guards every POST.
        if request.method == "POST" and request.POST.get("post") == "yes":
            task_id = self._publish(request, record, how)
            if task_id is not None:
                self.message_user(
                    request, how.done % {"record": record, "task_id": task_id}, messages.SUCCESS
                )
            return HttpResponseRedirect(page)
        context = {
            **self.admin_site.each_context(request),
            "title": how.title,
            "opts": self.opts,
            "record": record,
            "original": record,
            "resend": how,
        }
        template = f"admin/{self.opts.app_label}/{self.opts.model_name}/resend_confirmation.html"
        return TemplateResponse(request, template, context)

    def _resend_selected(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord], how: Resend
    ) -> None:
        chosen = list(queryset.filter(status=how.status, message__isnull=False))
        sent = [record for record in chosen if self._publish(request, record, how) is not None]
        if sent:
            message = (
                ngettext("Sent %(count)d record again.", "Sent %(count)d records again.", len(sent))
                if how is SEND_AGAIN
                else ngettext(
                    "%(count)d record runs again: it is PENDING, its attempts reset.",
                    "%(count)d records run again: they are PENDING, their attempts reset.",
                    len(sent),
                )
            )
            self.message_user(request, message % {"count": len(sent)}, messages.SUCCESS)
        skipped = queryset.count() - len(chosen)
        if skipped:
            message = ngettext(
                "%(count)d selected record was not %(status)s with a stored outbox message and was left alone.",
                "%(count)d selected records were not %(status)s with a stored outbox message and were left alone.",
                skipped,
            )
            self.message_user(request, message % {"count": skipped, "status": how.status}, messages.WARNING)
