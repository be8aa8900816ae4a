"""Offline link check of the Markdown files outside the docs site (README.md, CONTRIBUTING.md, …).

Links into this repository (relative paths, or GitHub URLs of its main branch) must name a file
that exists and, for a Markdown file, a heading that exists; other external links are not
checked here (``make docs-linkcheck`` checks them when online). The site's own pages are checked
by Sphinx (`make docs`, warnings as errors).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = (
    "https://github.com/django-idempotent-tasks/django-idempotent-tasks/blob/main/",
    "https://raw.githubusercontent.com/django-idempotent-tasks/django-idempotent-tasks/main/",
)
DEFAULT_FILES = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "BENCHMARKS.md", "example_project/README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def prose(path: Path) -> str:
    """The file's text without its fenced code blocks."""
    kept, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose(path).splitlines() if re.match(r"^#{1,6} ", line)}


def problems(path: Path) -> list[str]:
    found = []
    for target in LINK.findall(prose(path)):
        for prefix in REPOSITORY:
            if target.startswith(prefix):
                target = target[len(prefix) :]
        if re.match(r"^[a-z]+:", target):
            continue  # another site: checked online only
        name, _, anchor = target.partition("#")
        linked = (path.parent / name).resolve() if name else path
        if not linked.exists():
            found.append(f"{path.name}: {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            found.append(f"{path.name}: {target}: no such heading in {linked.relative_to(ROOT)}")
    return found


def main(names: list[str]) -> int:
    errors = [error for name in names for error in problems(ROOT / name)]
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or DEFAULT_FILES))
