"""Sphinx configuration of the documentation site: MyST Markdown pages, the Furo theme."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_idempotent_tasks import __version__  # noqa: E402

project = "django-idempotent-tasks"
author = "The django-idempotent-tasks authors"
copyright = "the django-idempotent-tasks authors"  # noqa: A001
release = version = __version__

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "images/*.md"]
# Links like [text](page.md#a-heading) resolve to GitHub-style heading slugs, checked at build time.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
# Raw HTML (the README's quickstart markers are HTML comments) is not a warning.
suppress_warnings: list[str] = []

html_theme = "furo"
html_title = f"django-idempotent-tasks {release}"
html_static_path: list[str] = []

# `make docs` builds offline: only links inside the site are checked (unresolved ones are warnings,
# which -W turns into errors). `make docs-linkcheck` checks the external ones when online.
linkcheck_anchors = False
linkcheck_timeout = 10
