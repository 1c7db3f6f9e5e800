"""No import circle inside harness/: every import a module can make (at the top, or inside a function when it
runs) is an edge; `if TYPE_CHECKING:` imports never run and are left out. A circle is reported with its path."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "harness"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _type_checking_only(tree: ast.Module) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for inner in node.body for child in ast.walk(inner))
    return skipped


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The harness modules `name` imports: `from harness.x import y` is harness.x.y where that is a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_only(tree)
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in known and target != name)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan), as one circle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_path_through(graph, group) for group in groups]


def _path_through(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A circle from the group's first module back to itself, for the failure message."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for target in sorted(graph[node] & members):
            if target == start:
                return [*paths[node], start]
            if target not in paths:
                paths[target] = [*paths[node], target]
                frontier.append(target)
    return group


def import_graph(root: Path) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def test_harness_has_no_import_circle():
    found = circles(import_graph(PACKAGE))
    assert not found, "import circles: " + "; ".join(" -> ".join(circle) for circle in found)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # the circle this test was written for: env -> matrix -> versions -> env, one edge inside a function
        ({"env.py": "from pkg.matrix import Cell\n", "matrix.py": "def f():\n    from pkg import versions\n",
          "versions.py": "from pkg.env import index_arguments\n"},
         [["pkg.env", "pkg.matrix", "pkg.versions", "pkg.env"]]),
        ({"a.py": "from . import b\n", "b.py": "import pkg.a\n"}, [["pkg.a", "pkg.b", "pkg.a"]]),
        # typing-only imports never run
        ({"a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
          "b.py": "from pkg import a\n"}, []),
        ({"a.py": "from pkg import b\n", "b.py": "import json\n"}, []),
    ],
)
def test_circles_are_found(tmp_path, files, expected):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    for name, text in files.items():
        (root / name).write_text(text)
    assert circles(import_graph(root)) == expected


def test_every_package_of_harness_ships_in_the_wheel():
    """setuptools' `packages` is a list written by hand: a new subpackage left out of it imports from a checkout
    but not from the wheel every workflow job installs."""
    import tomllib

    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    listed = set(pyproject["tool"]["setuptools"]["packages"])
    found = {module_name(path, PACKAGE) for path in PACKAGE.rglob("__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
