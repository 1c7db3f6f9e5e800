"""No import circle inside harness/: the `from harness... import` and `import harness...` statements a
module runs or type-checks at import time (its top level, `if TYPE_CHECKING:` and `try:` blocks included)
form a graph without cycles. A late import inside a function is how a module defers a heavy or optional
dependency, and does not count."""

from __future__ import annotations

import ast
from pathlib import Path

import harness

PACKAGE_DIR = Path(harness.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    found = set()
    for node in _module_level(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        # `from harness.results import X` names the package; `from harness import report` a module.
        found.update(name for name in names if name in modules)
        found.update(name for name in names if name not in modules and name.rsplit(".", 1)[0] in modules
                     and name.startswith("harness"))
    return {name if name in modules else name.rsplit(".", 1)[0] for name in found}


def _module_level(statements: list[ast.stmt]):
    for statement in statements:
        yield statement
        if isinstance(statement, (ast.If, ast.Try)):
            for block in (statement.body, statement.orelse, getattr(statement, "finalbody", []),
                          *(handler.body for handler in getattr(statement, "handlers", []))):
                yield from _module_level(block)


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in PACKAGE_DIR.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) - {name} for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle reachable by depth-first search, each named once by the path that closes it.
    A package and its own submodules (harness.results -> harness.results.model) are one unit."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if target.startswith(node + ".") or node.startswith(target + "."):
                continue
            if state.get(target) == "open":
                found.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_harness_has_no_import_circle():
    assert cycles(import_graph()) == []


def test_the_circle_check_finds_a_circle():
    assert cycles({"harness.a": {"harness.b"}, "harness.b": {"harness.a"}}) == [["harness.a", "harness.b", "harness.a"]]


def test_the_report_view_model_stands_apart_from_rendering_and_plots():
    graph = import_graph()
    assert "harness.report" not in graph["harness.plots"]
    assert graph["harness.report_model"].isdisjoint({"harness.report", "harness.plots"})
