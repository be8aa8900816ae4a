"""Release on a record's own page: a confirmation, a POST, a History entry."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.contrib import messages
from django.contrib.admin.models import CHANGE
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext

from django_idempotent_tasks import store
from django_idempotent_tasks.admin.actions import log_entries
from django_idempotent_tasks.models import IdempotencyRecord

if TYPE_CHECKING:
    from django.contrib import admin

    _ModelAdmin = admin.ModelAdmin[IdempotencyRecord]
else:
    _ModelAdmin = object

logger = logging.getLogger("django_idempotent_tasks")


class ReleaseView(_ModelAdmin):
    """``<pk>/release/``: confirm (GET), then release the stuck lease (POST), as the action does."""

    def has_release_lease_permission(self, request: HttpRequest) -> bool:
        """The custom permission that guards releasing a lease, here and in the changelist action."""
        return request.user.has_perm(f"{self.opts.app_label}.release_lease")

    def release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_release_lease_permission(request):
            raise PermissionDenied
        record = self.get_object(request, object_id)
        if record is None:
            raise Http404(gettext("No idempotency record with this id."))
        page = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[record.pk])
        if not record.is_stuck:
            message = gettext(
                "%(record)s is not stuck (IN_PROGRESS with an expired lease): nothing was changed."
            )
            self.message_user(request, message % {"record": record}, messages.WARNING)
            return HttpResponseRedirect(page)
        # Only a POST carrying the confirmation page's "post" field releases; CSRF guards every POST.
        if request.method == "POST" and request.POST.get("post") == "yes":
            by = request.user.get_username()
            if store.release_lease(record, by=by):
                log_entries(
                    request,
                    CHANGE,
                    f"Released the stuck lease of fence {record.fence}: the record is FAILED.",
                    [(record.pk, str(record))],
                )
                logger.info("Admin user %s released the stuck lease of %s.", by, record.pk)
                message = gettext(
                    "Released the stuck lease of %(record)s: the record is FAILED and the next delivery "
                    "runs the key again."
                )
                self.message_user(request, message % {"record": record}, messages.SUCCESS)
            else:
                message = gettext("%(record)s was taken over or finished meanwhile: nothing was changed.")
                self.message_user(request, message % {"record": record}, messages.WARNING)
            return HttpResponseRedirect(page)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Release the stuck lease?"),
            "opts": self.opts,
            "record": record,
            "original": record,
        }
        template = f"admin/{self.opts.app_label}/{self.opts.model_name}/release_confirmation.html"
        return TemplateResponse(request, template, context)
