from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


class ShopConfig(AppConfig):
    name = "shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from shop import receivers

        receivers.connect()
        if settings.SHOP_DEMO_HOOKS:
            from shop.demo import hooks

            hooks.connect()
