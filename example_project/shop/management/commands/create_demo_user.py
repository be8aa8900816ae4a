"""Create the superuser ``demo`` (password ``demo``) for the example project's admin."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the superuser demo with the password demo, for the example project's admin."

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        if user_model.objects.filter(username="demo").exists():
            self.stdout.write("The user demo exists already.")
            return
        user_model.objects.create_superuser("demo", "demo@example.com", "demo")
        self.stdout.write("Created the superuser demo (password demo): log in at /admin/.")
