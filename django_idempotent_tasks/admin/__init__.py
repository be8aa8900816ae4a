"""The read-only admin of idempotency records: find a key, see why it is stuck, release, send again or purge it."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_idempotent_tasks import history, keys, locks, store
from django_idempotent_tasks.admin import pending
from django_idempotent_tasks.admin.actions import RecordActions
from django_idempotent_tasks.admin.changelist import (
    EstimatedCountPaginator,
    ExpiredFilter,
    RecordChangeList,
    ScopeFilter,
    StuckFilter,
    search_condition,
)
from django_idempotent_tasks.admin.release import ReleaseView
from django_idempotent_tasks.admin.resend import NO_MESSAGE, RUN_AGAIN, SEND_AGAIN, ResendViews
from django_idempotent_tasks.models import IdempotencyRecord

logger = logging.getLogger("django_idempotent_tasks")
Status = IdempotencyRecord.Status
KEY_DISPLAY_LENGTH = 18
_BADGE_COLOURS = {
    "pending": "#6a1b9a",
    "succeeded": "#2e7d32",
    "failed": "#c62828",
    "in_progress": "#1565c0",
    "stuck": "#ef6c00",
}
_GENERAL = ("scope", "key", "task_name", "status_badge", "attempts", "fence", "fingerprint")
_HISTORY = ("attempts_history",)
_LEASE = ("lease_holder", "redis_lock")
_OUTCOME = ("result_json", "error_details", "checkpoints")
_DATES = ("created_at_display", "started", "completed_at_display", "expires")
_OUTBOX = ("outbox_state", "outbox_message")
# Long lines (a traceback, a JSON value) wrap inside the page instead of widening it.
_PRE = '<pre style="white-space:pre-wrap;overflow-wrap:anywhere">{}</pre>'
#: Times to the second (a 60 s lease is judged by them), in the current time zone, named.
TIME_FORMAT = "Y-m-d H:i:s T"


def _pretty_json(value: Any) -> SafeString:
    text = json.dumps(value, cls=DjangoJSONEncoder, indent=2, sort_keys=True, ensure_ascii=False)
    return format_html(_PRE, text)


def _when(moment: datetime | None) -> str:
    return formats.date_format(timezone.localtime(moment), TIME_FORMAT) if moment else "-"


def _folded(moment: datetime | None) -> SafeString | str:
    """A changelist time on two lines, date then clock and zone: a narrow column."""
    if moment is None:
        return "-"
    local = timezone.localtime(moment)
    return format_html(
        '<span style="white-space:nowrap">{}</span> <span style="white-space:nowrap">{}</span>',
        formats.date_format(local, "Y-m-d"),
        formats.date_format(local, "H:i:s T"),
    )


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ResendViews, ReleaseView, RecordActions):
    """Read-only: records are written by deliveries only; operators release, send again or delete them."""

    # Fits a 1366 px screen with both sidebars open (tests/test_operator_browser.py); the fence, the
    # start and the expiry are on the record's page, the expired records behind their filter.
    list_display = ("short_key", "task", "status_badge", "attempts", "created", "completed")
    list_filter = ("status", ScopeFilter, StuckFilter, ExpiredFilter)
    date_hierarchy = "created_at"
    search_fields = ("key", "task_id", "task_name")
    search_help_text = _(
        "An exact key, scope:key, task id or task name (case-sensitive); end with * to match a prefix "
        "(key*: fast); wrap in * to match anywhere (*42*: reads every record, seconds on millions)."
    )
    ordering = ("-pk",)
    list_per_page = 50
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    # Django 5.0+: facet counts would scan the table for every filter. The matrix's Django 4.2 leg
    # takes the other branch, never a `make test` run (Django 5.x).
    if hasattr(admin, "ShowFacets"):  # pragma: no branch
        show_facets = admin.ShowFacets.NEVER
    actions = (
        "delete_selected",
        "purge_selected_expired",
        "release_stuck_leases",
        "send_again_selected",
        "run_again_selected",
    )
    fieldsets = (
        (None, {"fields": _GENERAL}),
        (_("Attempts"), {"fields": _HISTORY}),
        (_("Lease"), {"fields": _LEASE}),
        (_("Outcome"), {"fields": _OUTCOME}),
        (_("Dates"), {"fields": _DATES}),
    )
    readonly_fields = _GENERAL + _HISTORY + _LEASE + _OUTCOME + _DATES + _OUTBOX

    # Records are written only by deliveries, through store.py.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: IdempotencyRecord | None = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[IdempotencyRecord]:
        # The write database, whatever the routers say about reads: a replica lagging behind would
        # show a finished key as running, and the actions below must delete what the page showed.
        return super().get_queryset(request).using(store.database())

    def get_fieldsets(self, request: HttpRequest, obj: IdempotencyRecord | None = None) -> Any:
        # The stored message, for outbox records and for the two statuses an operator may publish again.
        if obj is not None and (obj.message is not None or obj.status in (Status.PENDING, Status.FAILED)):
            return (*self.fieldsets[:1], (_("Outbox"), {"fields": _OUTBOX}), *self.fieldsets[1:])
        return self.fieldsets

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

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: IdempotencyRecord | None = None,
    ) -> HttpResponse:
        context["show_release"] = (
            obj is not None and obj.is_stuck and self.has_release_lease_permission(request)
        )
        resend = obj is not None and self.has_resend_permission(request)
        context["show_send_again"] = resend and SEND_AGAIN.applies_to(obj)  # type: ignore[arg-type]
        context["show_run_again"] = resend and RUN_AGAIN.applies_to(obj)  # type: ignore[arg-type]
        return super().render_change_form(request, context, add, change, form_url, obj)

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        purge = path(
            "purge-expired/", self.admin_site.admin_view(self.purge_expired_view), name=f"{name}_purge"
        )
        release = path(
            "<path:object_id>/release/", self.admin_site.admin_view(self.release_view), name=f"{name}_release"
        )
        send_again = path(
            "<path:object_id>/send-again/",
            self.admin_site.admin_view(self.send_again_view),
            name=f"{name}_send_again",
        )
        run_again = path(
            "<path:object_id>/run-again/",
            self.admin_site.admin_view(self.run_again_view),
            name=f"{name}_run_again",
        )
        return [purge, release, send_again, run_again, *super().get_urls()]

    @admin.display(description=_("key"), ordering="key")
    def short_key(self, obj: IdempotencyRecord) -> SafeString:
        key = obj.key
        shown = key if len(key) <= KEY_DISPLAY_LENGTH else f"{key[: KEY_DISPLAY_LENGTH - 1]}…"
        return format_html('<span title="{}" style="white-space:nowrap">{}</span>', key, shown)

    @admin.display(description=_("task / scope"), ordering="scope")
    def task(self, obj: IdempotencyRecord) -> SafeString:
        text = obj.task_name if obj.scope == obj.task_name else f"{obj.task_name} ({obj.scope})"
        # A dotted name may wrap after each dot: the column stays narrow enough for a 1366 px screen.
        return format_html_join(mark_safe(".<wbr>"), "{}", ((part,) for part in text.split(".")))

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: IdempotencyRecord) -> SafeString:
        kind, label = obj.status.lower(), obj.get_status_display()
        if obj.is_stuck:
            kind, label = "stuck", gettext("Stuck")
        elif obj.status == Status.PENDING:
            # How long the caller's message has been on its way: the re-drive sends it again later.
            label = f"{label} {pending.age(pending.since(obj))}"
        return format_html(
            '<span class="idempotency-status idempotency-status-{}" style="background:{};color:#fff;'
            'padding:1px 8px;border-radius:8px;white-space:nowrap">{}</span>',
            kind,
            _BADGE_COLOURS[kind],
            label,
        )

    @admin.display(description=_("lease holder"))
    def lease_holder(self, obj: IdempotencyRecord) -> SafeString:
        if obj.status != Status.IN_PROGRESS:
            state = gettext("none: the record is %(status)s") % {"status": obj.get_status_display()}
        elif obj.lease_is_live:
            state = gettext("live")
        else:
            state = gettext("expired: the holder died or stalled")
        rows = [
            (gettext("worker"), obj.worker or "-"),
            (gettext("task id"), obj.task_id or "-"),
            (gettext("lease expires at"), _when(obj.lease_expires_at)),
            (gettext("lease"), state),
        ]
        return format_html(
            '<table class="idempotency-lease">{}</table>',
            format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows),
        )

    @admin.display(description=_("Redis lock now"))
    def redis_lock(self, obj: IdempotencyRecord) -> str:
        try:
            token = locks.lock_holder(locks.lock_client(), keys.lock_name(obj.scope, obj.key))
        except Exception:  # the page must render whatever the lock cache does
            logger.warning("Could not read the lock of %s from Redis.", keys.loggable(obj.key), exc_info=True)
            return gettext("unknown (Redis did not answer)")
        if token is None:
            return gettext("not held")
        # A token is "<host>:<pid>:<random>": the random part says nothing to a reader.
        return gettext("held by %(holder)s") % {"holder": token.rsplit(":", 1)[0]}

    @admin.display(description=_("result"))
    def result_json(self, obj: IdempotencyRecord) -> SafeString | str:
        return _pretty_json(obj.result) if obj.status == Status.SUCCEEDED else "-"

    @admin.display(description=_("error"))
    def error_details(self, obj: IdempotencyRecord) -> SafeString | str:
        if not obj.error:
            return "-"
        error = obj.error if isinstance(obj.error, dict) else {"message": obj.error}
        return format_html(
            "<strong>{}</strong>: {}" + _PRE,
            error.get("type", ""),
            error.get("message", ""),
            error.get("traceback", ""),
        )

    @admin.display(description=_("history"))
    def attempts_history(self, obj: IdempotencyRecord) -> SafeString | str:
        found = history.attempts(obj.attempts_log)
        if not found:
            return gettext("No attempt recorded.")
        rows = [
            (attempt.describe(), attempt.task_id or "-", _when(attempt.claimed_at), _when(attempt.ended_at))
            for attempt in found
        ]
        return format_html(
            '<table class="idempotency-history"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th>'
            "</tr></thead><tbody>{}</tbody></table>",
            gettext("attempt"),
            gettext("task id"),
            gettext("began"),
            gettext("ended"),
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows),
        )

    @admin.display(description=_("created"), ordering="created_at")
    def created(self, obj: IdempotencyRecord) -> SafeString | str:
        return _folded(obj.created_at)

    @admin.display(description=_("started at"), ordering="started_at")
    def started(self, obj: IdempotencyRecord) -> str:
        return _when(obj.started_at)

    @admin.display(description=_("completed"), ordering="completed_at")
    def completed(self, obj: IdempotencyRecord) -> SafeString | str:
        return _folded(obj.completed_at)

    @admin.display(description=_("created at"))
    def created_at_display(self, obj: IdempotencyRecord) -> str:
        return _when(obj.created_at)

    @admin.display(description=_("completed at"))
    def completed_at_display(self, obj: IdempotencyRecord) -> str:
        return _when(obj.completed_at)

    @admin.display(description=_("expires at"))
    def expires(self, obj: IdempotencyRecord) -> str:
        return _when(obj.expires_at)

    @admin.display(description=_("checkpoints"))
    def checkpoints(self, obj: IdempotencyRecord) -> SafeString | str:
        return _pretty_json(obj.steps) if obj.steps else gettext("No checkpoint yet.")

    @admin.display(description=_("outbox"))
    def outbox_state(self, obj: IdempotencyRecord) -> str:
        if obj.message is None:
            return str(NO_MESSAGE) if obj.status in (Status.PENDING, Status.FAILED) else "-"
        return pending.describe(obj)

    @admin.display(description=_("stored message"))
    def outbox_message(self, obj: IdempotencyRecord) -> SafeString | str:
        return _pretty_json(obj.message) if obj.message is not None else "-"
