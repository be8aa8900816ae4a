"""The package's modules import each other in one direction: front ends, spec, delivery, lease, store."""

from __future__ import annotations

import ast
from pathlib import Path

import django_idempotent_tasks

PACKAGE = "django_idempotent_tasks"
ROOT = Path(django_idempotent_tasks.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every package module and the package modules it imports anywhere (TYPE_CHECKING included)."""
    modules = {module_name(path): path for path in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            found: list[str] = []
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base])
                    base = base.rstrip(".")
                found = [base] + [f"{base}.{alias.name}" for alias in node.names]
            graph[name].update(
                target for target in found if target in modules and target not in (name, PACKAGE)
            )
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph[node]):
            found = visit(target, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_the_package_imports_form_no_cycle() -> None:
    graph = import_graph()
    assert f"{PACKAGE}.delivery" in graph[f"{PACKAGE}.tasks"]  # the graph sees imports at all
    assert cycle(graph) is None


def test_the_heartbeat_imports_no_module_of_the_package() -> None:
    assert import_graph()[f"{PACKAGE}.heartbeat"] == set()


def test_a_cycle_is_found() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
