"""Check the built distributions: contents of the wheel and sdist, then install the wheel into a
clean virtualenv with only its declared dependencies and use it there.

Usage: python scripts/check_dist.py dist/
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_idempotent_tasks"
# Files of the package that are not Python modules but must ship (templates, translations, markers).
DATA_SUFFIXES = {".html", ".txt", ".css", ".js", ".po", ".mo", ".json", ".typed"}
NOT_SHIPPED = ("tests/", "example_project/", "scripts/", "docs/")
REQUIREMENTS = ROOT / "requirements"
PROJECT_URLS = ("Documentation", "Changelog", "Source", "Issues")
# A Markdown link or image, or an HTML src/href, whose target is not absolute: broken on PyPI.
RELATIVE_LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s]+)\)|(?:src|href)=\"(?!https?://|#)([^\"]+)\"")


def dev_tools() -> set[str]:
    """Every package our own test, lint and benchmark runs install (requirements/): none is published."""
    names = set()
    for path in REQUIREMENTS.glob("*.txt"):
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                names.add(_name(line))
    return names


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


PUBLISHED_EXTRAS = {"metrics", "opentelemetry"}


def package_files() -> set[str]:
    """The files of the package in the source tree that a wheel must contain."""
    files = set()
    for path in (ROOT / PACKAGE).rglob("*"):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.suffix == ".py" or path.suffix in DATA_SUFFIXES or path.name == "py.typed":
            files.add(path.relative_to(ROOT).as_posix())
    return files


def check_wheel(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(package_files() - names)
    assert not missing, f"{wheel.name} lacks {missing}"
    for required in (f"{PACKAGE}/py.typed", f"{PACKAGE}/migrations/0001_initial.py"):
        assert required in names, f"{wheel.name} lacks {required}"
    shipped = sorted(name for name in names if name.startswith(NOT_SHIPPED))
    assert not shipped, f"{wheel.name} ships {shipped}"
    [entry_points] = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert f"[pytest11]\n{PACKAGE} = {PACKAGE}.pytest_plugin" in text, text
    print(f"{wheel.name}: {len(names)} files, package data and entry point present, no tests.")


def check_metadata(wheel: Path) -> None:
    """The wheel's dependencies and extras are the users' only: no dev tool leaks into them."""
    archive = zipfile.ZipFile(wheel)
    [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
    lines = archive.read(metadata).decode().splitlines()
    requires = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    extras = {line.split(":", 1)[1].strip() for line in lines if line.startswith("Provides-Extra:")}
    names = {_name(req) for req in requires}
    leaked = sorted(names & dev_tools())
    assert not leaked, f"{wheel.name} declares dev tools (requirements/) as dependencies: {leaked}"
    assert extras == PUBLISHED_EXTRAS, f"{wheel.name} publishes extras {sorted(extras)}"
    for label in PROJECT_URLS:
        found = any(line.startswith(f"Project-URL: {label}, https://") for line in lines)
        assert found, f"{wheel.name} has no {label} in project_urls"
    for field in ("Author", "Keywords"):
        assert any(line.startswith(f"{field}: ") for line in lines), f"{wheel.name} has no {field}"
    description = "\n".join(lines[lines.index("") + 1 :])  # the README, after the headers
    relative = sorted({a or b for a, b in RELATIVE_LINK.findall(description)})
    assert not relative, f"{wheel.name}'s README has relative links, broken on PyPI: {relative}"
    print(f"{wheel.name}: requires {sorted(names)}, extras {sorted(extras)}, no dev tools, absolute links.")


def check_sdist(sdist: Path) -> None:
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    missing = sorted(({"README.md", "LICENSE", "setup.cfg", "pyproject.toml"} | package_files()) - names)
    assert not missing, f"{sdist.name} lacks {missing}"
    print(f"{sdist.name}: {len(names)} files, package and metadata present.")


def check_install(wheel: Path) -> None:
    """Install the wheel alone (pip resolves its declared dependencies) and use it outside the tree."""
    with tempfile.TemporaryDirectory(prefix="idem-dist-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)], check=True
        )
        # Run from the temporary directory with isolated mode, so the source tree cannot be imported.
        subprocess.run(
            [python, "-I", str(ROOT / "scripts" / "dist_smoke.py"), str(wheel.name.split("-")[1])],
            check=True,
            cwd=tmp,
        )


def main(dist: str) -> None:
    wheels = sorted(Path(dist).glob("*.whl"))
    sdists = sorted(Path(dist).glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, f"expected one wheel and one sdist in {dist}"
    check_wheel(wheels[0])
    check_metadata(wheels[0])
    check_sdist(sdists[0])
    check_install(wheels[0])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "dist")
