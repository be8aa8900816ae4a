"""Use the installed wheel in a clean virtualenv: run by check_dist.py with that virtualenv's python.

Usage: python -I dist_smoke.py VERSION (from an empty directory, so only the installed copy imports)
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

SETTINGS = """
SECRET_KEY = "dist-smoke"
USE_TZ = True
INSTALLED_APPS = ["django_idempotent_tasks"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:6379/15"}}
"""


def main(version: str) -> None:
    Path("smoke_settings.py").write_text(SETTINGS)
    sys.path.insert(0, os.getcwd())
    os.environ["DJANGO_SETTINGS_MODULE"] = "smoke_settings"

    import django

    django.setup()

    from django.core.management import call_command

    import django_idempotent_tasks
    from django_idempotent_tasks import tasks, testing
    from django_idempotent_tasks.models import IdempotencyRecord

    location = Path(django_idempotent_tasks.__file__).resolve()
    assert location.is_relative_to(Path(sys.prefix).resolve()), f"imported from {location}, not the venv"
    assert (
        django_idempotent_tasks.__version__
        == version
        == importlib.metadata.version("django-idempotent-tasks")
    )
    assert (location.parent / "py.typed").is_file()
    assert tasks.IdempotentTask.abstract and callable(testing.assert_runs_once)

    call_command("check", fail_level="ERROR")
    call_command("migrate", verbosity=0)
    call_command("makemigrations", "django_idempotent_tasks", check_changes=True, dry_run=True, verbosity=0)
    assert IdempotencyRecord.objects.count() == 0
    print(
        f"django-idempotent-tasks {version} installs, imports, checks and migrates (Django {django.__version__})."
    )


if __name__ == "__main__":
    main(sys.argv[1])
