from __future__ import annotations

from django.contrib import admin

from shop.models import Charge, Delivery, Order, Replay


class ChargeInline(admin.TabularInline):
    model = Charge
    extra = 0
    can_delete = False
    readonly_fields = ("charge_id", "amount_cents", "idempotency_key", "duplicate_requests", "confirmed_at")


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("pk", "customer_email", "amount_cents", "created_at")
    inlines = [ChargeInline]


@admin.register(Charge)
class ChargeAdmin(admin.ModelAdmin):
    list_display = (
        "charge_id",
        "order",
        "amount_cents",
        "idempotency_key",
        "duplicate_requests",
        "confirmed_at",
    )
    list_filter = ("confirmed_at",)


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("task_id", "task_name", "order", "pid", "redelivered", "outcome", "started_at")
    list_filter = ("task_name", "outcome", "redelivered")


@admin.register(Replay)
class ReplayAdmin(admin.ModelAdmin):
    list_display = ("key", "scope", "count")
