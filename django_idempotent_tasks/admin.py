"""The read-only admin of idempotency records: find a key, see why it is stuck, release or purge it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_idempotent_tasks import admin_display as display
from django_idempotent_tasks import store
from django_idempotent_tasks.admin_changelist import (
    EstimatedCountPaginator,
    ExpiredFilter,
    ScopeFilter,
    StuckFilter,
    search_condition,
)
from django_idempotent_tasks.models import IdempotencyRecord

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[IdempotencyRecord]
else:
    _ModelAdmin = admin.ModelAdmin

logger = logging.getLogger("django_idempotent_tasks")
Status = IdempotencyRecord.Status
PURGE_BATCH_SIZE = 1000
_GENERAL = ("scope", "key", "task_name", "status_badge", "attempts", "fence", "fingerprint")
_LEASE = ("lease_holder", "redis_lock")
_OUTCOME = ("result_json", "error_details", "checkpoints")
_DATES = ("created_at", "started_at", "completed_at", "expires_at")


class RecordChangeList(ChangeList):
    """Leaves the large JSON columns out of the changelist's SELECT."""

    # *args: Django 5.0 added exclude_parameters, which 4.2 does not accept.
    def get_queryset(self, request: HttpRequest, *args: Any, **kwargs: Any) -> QuerySet[Any]:
        queryset = super().get_queryset(request, *args, **kwargs).defer("result", "error", "steps")
        if self.params.get(ExpiredFilter.parameter_name) == "yes" and ORDER_VAR not in self.params:
            # Expired records are the oldest: walking the primary key down from the newest would
            # read most of the table before finding them. Sorting "pk + 0" lets PostgreSQL fetch
            # them through the expires_at index and sort only those.
            queryset = queryset.order_by((F("pk") + 0).desc())
        return queryset


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(_ModelAdmin):
    """Read-only: records are written by deliveries only; operators release or delete them."""

    list_display = (
        "short_key",
        "task",
        "status_badge",
        "attempts",
        "fence",
        "created_at",
        "completed_at",
        "expires_at",
    )
    list_filter = ("status", ScopeFilter, StuckFilter, ExpiredFilter)
    date_hierarchy = "created_at"
    search_fields = ("key", "task_id", "task_name")
    search_help_text = _(
        "An exact key, scope:key, task id or task name (case-sensitive); end with * to match a prefix."
    )
    ordering = ("-pk",)
    list_per_page = 50
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    if hasattr(admin, "ShowFacets"):  # Django 5.0+: facet counts would scan the table for every filter
        show_facets = admin.ShowFacets.NEVER
    actions = ("delete_selected", "purge_selected_expired", "release_stuck_leases")
    fieldsets = (
        (None, {"fields": _GENERAL}),
        (_("Lease"), {"fields": _LEASE}),
        (_("Outcome"), {"fields": _OUTCOME}),
        (_("Dates"), {"fields": _DATES}),
    )
    readonly_fields = _GENERAL + _LEASE + _OUTCOME + _DATES

    # Records are written only by deliveries, through store.py.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: IdempotencyRecord | None = None) -> bool:
        return False

    def has_release_lease_permission(self, request: HttpRequest) -> bool:
        """The custom permission that guards "Release stuck lease"."""
        return request.user.has_perm(f"{self.opts.app_label}.release_lease")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RecordChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord], search_term: str
    ) -> tuple[QuerySet[IdempotencyRecord], bool]:
        if not search_term.strip().rstrip("*"):
            return queryset, False
        return queryset.filter(search_condition(search_term)), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {"has_delete_permission": self.has_delete_permission(request), **(extra_context or {})}
        return super().changelist_view(request, extra)

    def get_urls(self) -> list[URLPattern]:
        purge = path(
            "purge-expired/",
            self.admin_site.admin_view(self.purge_expired_view),
            name=f"{self.opts.app_label}_{self.opts.model_name}_purge",
        )
        return [purge, *super().get_urls()]

    # Changelist columns and detail fields.
    @admin.display(description=_("key"), ordering="key")
    def short_key(self, obj: IdempotencyRecord) -> SafeString:
        return display.short_key(obj.key)

    @admin.display(description=_("task / scope"), ordering="scope")
    def task(self, obj: IdempotencyRecord) -> str:
        return obj.task_name if obj.scope == obj.task_name else f"{obj.task_name} ({obj.scope})"

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: IdempotencyRecord) -> SafeString:
        return display.status_badge(obj)

    @admin.display(description=_("lease holder"))
    def lease_holder(self, obj: IdempotencyRecord) -> SafeString:
        return display.lease_table(obj)

    @admin.display(description=_("Redis lock now"))
    def redis_lock(self, obj: IdempotencyRecord) -> str:
        return display.lock_state(obj)

    @admin.display(description=_("result"))
    def result_json(self, obj: IdempotencyRecord) -> SafeString | str:
        return display.pretty_json(obj.result) if obj.status == Status.SUCCEEDED else "-"

    @admin.display(description=_("error"))
    def error_details(self, obj: IdempotencyRecord) -> SafeString | str:
        return display.error_details(obj.error)

    @admin.display(description=_("checkpoints"))
    def checkpoints(self, obj: IdempotencyRecord) -> SafeString | str:
        return display.pretty_json(obj.steps) if obj.steps else gettext("No checkpoint yet.")

    # Actions and the purge view.
    @admin.action(description=_("Delete selected records"), permissions=["delete"])
    def delete_selected(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> TemplateResponse | None:
        return self._confirm_and_purge(request, queryset, action="delete_selected")

    @admin.action(description=_("Purge expired records among the selected"), permissions=["delete"])
    def purge_selected_expired(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> TemplateResponse | None:
        expired = queryset & IdempotencyRecord.objects.expired()
        return self._confirm_and_purge(request, expired, action="purge_selected_expired")

    @admin.action(description=_("Release stuck lease"), permissions=["release_lease"])
    def release_stuck_leases(self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]) -> None:
        by = request.user.get_username()
        stuck = list(queryset & IdempotencyRecord.objects.stuck())
        released = sum(store.release_lease(record, by=by) for record in stuck)
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
        response = self._confirm_and_purge(request, IdempotencyRecord.objects.expired(), action=None)
        return response or HttpResponseRedirect(
            reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
        )

    def _confirm_and_purge(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord], *, action: str | None
    ) -> TemplateResponse | None:
        # Only a POST carrying the confirmation page's "post" field deletes; CSRF guards every POST.
        if request.method == "POST" and request.POST.get("post") == "yes":
            deleted = store.purge(queryset, batch_size=PURGE_BATCH_SIZE)
            # Deleting makes keys runnable again: leave a trace of who did it.
            logger.info(
                "Admin user %s deleted idempotency records: %d.", request.user.get_username(), deleted
            )
            message = ngettext("Deleted %(count)d record.", "Deleted %(count)d records.", deleted)
            self.message_user(request, message % {"count": deleted}, messages.SUCCESS)
            return None
        count = queryset.count()
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Purge expired records") if action is None else gettext("Are you sure?"),
            "opts": self.opts,
            "count": count,
            "expired_only": action != "delete_selected",
            "action": action,
            "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        template = f"admin/{self.opts.app_label}/{self.opts.model_name}/purge_confirmation.html"
        return TemplateResponse(request, template, context)
