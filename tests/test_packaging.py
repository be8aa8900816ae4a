"""The package metadata says what is tested: classifiers against the tox matrix, one version."""

from __future__ import annotations

import configparser
import importlib.util
import itertools
import re
from typing import Any

import django_idempotent_tasks
from tests.helpers import ROOT


def tox_legs() -> set[tuple[str, str, str]]:
    """(python, django, celery) of every leg in tox.ini's env_list, braces expanded."""
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    legs = set()
    for line in tox["tox"]["env_list"].split():
        choices = [part.split(",") for part in re.findall(r"\{([^}]*)\}", line)]
        template = re.sub(r"\{[^}]*\}", "{}", line)
        for combination in itertools.product(*choices):
            python, django, celery = template.format(*combination).split("-")
            legs.add((python, django, celery))
    return legs


def classifiers() -> list[str]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return setup["metadata"]["classifiers"].split("\n")


def dotted(factor: str, prefix: str) -> str:
    digits = factor.removeprefix(prefix)
    return f"{digits[0]}.{digits[1:]}"


def test_the_classifiers_name_exactly_the_tested_pythons_and_djangos() -> None:
    legs = tox_legs()
    tested_pythons = {dotted(python, "py") for python, _, _ in legs}
    tested_djangos = {dotted(django, "django") for _, django, _ in legs}
    named_pythons = {
        c.rsplit(" :: ", 1)[1]
        for c in classifiers()
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    named_djangos = {c.rsplit(" :: ", 1)[1] for c in classifiers() if c.startswith("Framework :: Django :: ")}
    assert named_pythons == tested_pythons == {"3.10", "3.11", "3.12", "3.13"}
    assert named_djangos == tested_djangos == {"4.2", "5.2", "6.0", "6.1"}


def test_every_python_and_django_pair_runs_with_the_oldest_and_newest_celery() -> None:
    legs = tox_legs()
    pairs = {(python, django) for python, django, _ in legs}
    assert legs == {
        (python, django, celery) for python, django in pairs for celery in ("celery54", "celery57")
    }
    # Django 6.x needs Python 3.12+; Django 4.2 stops at 3.12.
    assert ("py311", "django60") not in pairs and ("py313", "django42") not in pairs
    assert len(legs) == 22


def test_the_version_lives_in_one_place() -> None:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert setup["metadata"]["version"] == "attr: django_idempotent_tasks.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", django_idempotent_tasks.__version__)


def check_dist() -> Any:
    """scripts/check_dist.py, the checks `make dist-check` runs on the built wheel."""
    spec = importlib.util.spec_from_file_location("check_dist", ROOT / "scripts" / "check_dist.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_has_only_absolute_links_for_pypi() -> None:
    checks = check_dist()
    assert checks.RELATIVE_LINK.findall('[a](docs/a.md) ![b](docs/b.png) <img src="x.png">') == [
        ("docs/a.md", ""),
        ("docs/b.png", ""),
        ("", "x.png"),
    ]
    assert checks.RELATIVE_LINK.findall((ROOT / "README.md").read_text()) == []


def test_no_requirements_file_tool_is_a_published_dependency() -> None:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    checks = check_dist()
    published = {checks._name(line) for line in setup["options"]["install_requires"].split()}
    for extra in ("metrics", "opentelemetry"):
        published |= {checks._name(line) for line in setup["options.extras_require"][extra].split()}
    assert {"pytest", "ruff", "django-celery-beat", "celery-once"} <= checks.dev_tools()
    assert not published & checks.dev_tools()
