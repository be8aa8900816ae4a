"""The admin's destructive actions: delete, purge and release, each leaving an admin log entry."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_idempotent_tasks import purging, store
from django_idempotent_tasks.models import IdempotencyRecord

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[IdempotencyRecord]
else:
    _ModelAdmin = admin.ModelAdmin

logger = logging.getLogger("django_idempotent_tasks")
PURGE_BATCH_SIZE = 1000


#: Up to this many deleted records get an admin log entry each; a larger purge gets one entry.
LOGGED_DELETIONS = 100


def log_entries(request: HttpRequest, flag: int, message: str, records: list[tuple[Any, str]]) -> None:
    """Rows of the admin log ("Recent actions", an object's "History") for ``request``'s user.

    ``records`` are (pk, repr) pairs; (None, repr) logs the action without naming one record.
    """
    # LogEntry.objects.log_action() is deprecated from Django 5.1 and log_actions() is missing
    # before it: create the rows directly, as both do.
    content_type = ContentType.objects.get_for_model(IdempotencyRecord).pk
    LogEntry.objects.bulk_create(
        LogEntry(
            user_id=request.user.pk,  # type: ignore[misc]  # the admin's users are authenticated
            content_type_id=content_type,
            object_id=None if pk is None else str(pk),
            object_repr=text[:200],
            action_flag=flag,
            change_message=message,
        )
        for pk, text in records
    )


def purge_logged(request: HttpRequest, queryset: QuerySet[IdempotencyRecord], how: str) -> int:
    """Purge ``queryset`` on the write database, logging each deleted record (or the purge, if large)."""
    queryset = queryset.using(store.database())
    named = list(queryset.values_list("pk", "scope", "key")[: LOGGED_DELETIONS + 1])
    deleted = purging.purge(queryset, batch_size=PURGE_BATCH_SIZE)
    message = f"Deleted ({how})."
    if len(named) > LOGGED_DELETIONS:
        log_entries(request, DELETION, message, [(None, f"{deleted} idempotency records")])
        return deleted
    # The purge spares records that a delivery took over meanwhile: log only those it deleted.
    kept = set(store.records().filter(pk__in=[pk for pk, _, _ in named]).values_list("pk", flat=True))
    log_entries(
        request, DELETION, message, [(pk, f"{scope}:{key}") for pk, scope, key in named if pk not in kept]
    )
    return deleted


class RecordActions(_ModelAdmin):
    """Delete, purge and release stuck leases; every write goes to the records' write database."""

    @admin.action(description=_("Delete selected records"), permissions=["delete"])
    def delete_selected(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> TemplateResponse | None:
        return self._confirm_and_purge(request, queryset, action="delete_selected")

    @admin.action(description=_("Purge expired records among the selected"), permissions=["delete"])
    def purge_selected_expired(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> TemplateResponse | None:
        expired = queryset & store.records().expired()
        return self._confirm_and_purge(request, expired, action="purge_selected_expired")

    @admin.action(description=_("Release stuck lease"), permissions=["release_lease"])
    def release_stuck_leases(self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]) -> None:
        by = request.user.get_username()
        released = 0
        for record in queryset & store.records().stuck():
            if store.release_lease(record, by=by):
                released += 1
                message = f"Released the stuck lease of fence {record.fence}: the record is FAILED."
                log_entries(request, CHANGE, message, [(record.pk, str(record))])
        logger.info("Admin user %s released stuck leases: %d.", by, released)
        if released:
            message = ngettext(
                "Released %(count)d stuck lease: the record is FAILED and the next delivery runs the key again.",
                "Released %(count)d stuck leases: the records are FAILED and the next delivery runs their keys again.",
                released,
            )
            self.message_user(request, message % {"count": released}, messages.SUCCESS)
        skipped = queryset.count() - released
        if skipped:
            message = ngettext(
                "%(count)d selected record was not stuck (IN_PROGRESS with an expired lease) and was left alone.",
                "%(count)d selected records were not stuck (IN_PROGRESS with an expired lease) and were left alone.",
                skipped,
            )
            self.message_user(request, message % {"count": skipped}, messages.WARNING)

    def purge_expired_view(self, request: HttpRequest) -> HttpResponse:
        """Confirm (GET) and purge (POST) every expired record."""
        if not self.has_delete_permission(request):
            raise PermissionDenied
        response = self._confirm_and_purge(request, store.records().expired(), action=None)
        return response or HttpResponseRedirect(
            reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
        )

    def _confirm_and_purge(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord], *, action: str | None
    ) -> TemplateResponse | None:
        # Only a POST carrying the confirmation page's "post" field deletes; CSRF guards every POST.
        if request.method == "POST" and request.POST.get("post") == "yes":
            # Deleting makes keys runnable again: leave a trace of who did it.
            deleted = purge_logged(
                request, queryset, "purge of the expired records" if action is None else action
            )
            logger.info(
                "Admin user %s deleted idempotency records: %d.", request.user.get_username(), deleted
            )
            message = ngettext("Deleted %(count)d record.", "Deleted %(count)d records.", deleted)
            self.message_user(request, message % {"count": deleted}, messages.SUCCESS)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Purge expired records") if action is None else gettext("Are you sure?"),
            "opts": self.opts,
            "count": queryset.count(),
            "expired_only": action != "delete_selected",
            "action": action,
            "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        template = f"admin/{self.opts.app_label}/{self.opts.model_name}/purge_confirmation.html"
        return TemplateResponse(request, template, context)
