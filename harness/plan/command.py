"""`harness matrix`: list the named matrices, or print a matrix's selected cells as ids, JSON or the
workflow's `strategy.matrix`, refusing persistent runners for a pull request (`--pull-request`) and pins the
package index lacks first (an index that cannot be asked is a warning, or with `--check` an error)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping

from harness.errors import ConfigError
from harness.plan import isolation, pins
from harness.plan.cells import Cell, Runner
from harness.plan.matrix import MatrixSource, load_matrix, named_matrices, select
from harness.plan.packing import plan_jobs
from harness.plan.runners import load_runners
from harness.project import project_root


def command(args, check_settings: Callable[[list[Cell]], None]) -> int:
    """`harness matrix`; `check_settings` is the engines' reading of each cell's `submit:` (the plan knows no
    engine: the command line hands it down)."""
    if args.list:
        print(format_sources(named_matrices(project_root())))
        return 0
    if not args.matrix:
        raise ConfigError("harness matrix: give --matrix NAME_OR_PATH, or --list to see the names")
    matrix = load_matrix(args.matrix)
    cells = select(matrix.cells, args.cell)
    if not cells:
        raise ConfigError(f"{matrix.path}: no cell matches --cell {' '.join(args.cell)}")
    check_settings(cells)
    runners = load_runners(matrix.root, beside=matrix.path.parent)
    if args.pull_request:
        isolation.refuse_persistent_runners(cells, runners, str(matrix.path))
    pins.check_pins(cells, str(matrix.path), warn=None if args.check else warn)
    print(format_cells(cells, args.format, runners))
    return 0


def warn(message: str) -> None:
    """One line on stderr, an annotation under GitHub Actions: stdout is the plan a workflow reads."""
    prefix = "::warning::" if os.environ.get("GITHUB_ACTIONS") == "true" else "harness: warning: "
    print(prefix + message, file=sys.stderr, flush=True)


def format_cells(cells: list[Cell], fmt: str, runners: Mapping[str, Runner]) -> str:
    """ids and json list every cell; github lists every job, a pack of cells (runners.yaml `pack: true`) as one."""
    if fmt == "ids":
        return "\n".join(cell.id for cell in cells)
    if fmt == "json":
        return json.dumps([cell.to_json() for cell in cells], indent=2)
    if fmt == "github":
        return json.dumps({"include": [job.to_github() for job in plan_jobs(cells, runners)]}, separators=(",", ":"))
    raise ConfigError(f"unknown format {fmt!r}")


def format_sources(sources: list[MatrixSource]) -> str:
    """One line per named matrix: name, where it comes from, and what it overrides."""
    width = max((len(source.name) for source in sources), default=4)
    lines = []
    for source in sources:
        hides = f" (overrides {source.hides})" if source.hides else ""
        lines.append(f"{source.name:<{width}}  {source.origin:<10}  {source.path}{hides}")
    return "\n".join(lines)
