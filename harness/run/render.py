"""The render stage of `harness run`: what the terminal shows.

Takes the `CellOutcome`s (from record) and prints the cells' table, as `harness report` renders the terminal
format from their folders, then where the results are and how to render them. For a dry run it takes the
`Plan` (from plan) instead and prints what each cell would do, and what of an earlier run would be kept aside.
`progress` is harness's own lines while the cells run (the `log` every stage is given).
"""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.cell import preflight
from harness.engines.base import pytest_command
from harness.envs import cache as env_cache
from harness.envs.build import EnvironmentBuildError, plan_environment
from harness.run import earlier, packed
from harness.run.plan import Plan, summarize_refusals
from harness.run.record import CellOutcome


def progress(line: str) -> None:
    print(line, flush=True)


def print_outcomes(outcomes: Sequence[CellOutcome], results_root: Path, kept: Path | None = None) -> None:
    print_table([outcome.folder for outcome in outcomes])
    print_where(results_root, kept)


def print_plan(plan: Plan) -> None:
    matrix, host, cells, refused, results_root = plan.matrix, plan.host, plan.cells, plan.refused, plan.results_root
    where = f"{len(host.gpus)} x {host.gpus[0].name}" if host.gpus else "no GPU"
    print(f"matrix {matrix.name} ({matrix.path}); project {matrix.root}; this machine: {where}")
    for cell in cells:
        if cell.id in refused:
            print(f"{cell.id}\n  would be refused: {refused[cell.id]}")
            continue
        try:
            origin, python, path = plan_environment(preflight.environment_spec(cell), plan.env_dir)
        except EnvironmentBuildError as error:
            origin, python, path = f"unusable ({error})", Path(sys.executable), None
        building = f"build {path}"
        if origin == "build":
            problem = preflight.pin_problem(cell, plan.env_dir)
            building = (f"cannot build {path}: {problem} (the cell would be errored at once)" if problem
                        else f"{building} ({env_cache.build_reason(preflight.environment_spec(cell), plan.env_dir)})")
        environment = {"current": "this interpreter", "cached": f"cached {path}", "build": building}
        print(f"{cell.id}")
        print(f"  environment: {environment.get(origin, origin)}")
        print(f"  results:     {results_root / cell.id}")
        command = pytest_command(cell, python, results_root / cell.id, plan.pytest_args,
                                 plan.pack_tests and cell.engine == "local")
        print(f"  command:     {shlex.join(command)}")
    for pack in packed.rounds(plan):
        if len(pack) > 1:
            print(f"at once on this machine (runners.yaml pack): {', '.join(cell.id for cell in pack)}")
    kept = earlier.describe_plan(results_root, [cell.id for cell in cells])
    if kept:
        print(kept)
    if refused:
        print(f"this machine cannot host {len(refused)} of {len(cells)} cells: {summarize_refusals(refused)}; "
              "harness run would stop with exit 3 (pick others with --cell, or pass --force)")


def print_table(folders: list[Path]) -> None:
    from harness.report.render import render
    from harness.report.terminal import wants_color
    from harness.results import load_results

    print(render(load_results([str(folder) for folder in folders]), "terminal", color=wants_color(sys.stdout)))


def print_where(results_root: Path, kept: Path | None = None) -> None:
    """`kept`: where this run kept the earlier run aside (earlier.py), if it did."""
    print(f"results: {results_root}")
    print(f"render:  {shlex.quote(this_command())} report {shlex.quote(str(results_root))} -o harness-report.html")
    if kept is not None:
        print(f"kept:    {kept} (the earlier run; {shlex.quote(this_command())} report {shlex.quote(str(kept))} "
              "renders it)")


def this_command() -> str:
    """How the user ran harness: `harness` where PATH finds this very script, else the path they typed
    (`.venv/bin/harness`), so the hint runs as printed."""
    typed = sys.argv[0] if sys.argv and sys.argv[0] else "harness"
    found = shutil.which("harness")
    if Path(typed).name == "harness" and found and Path(found).resolve() == Path(typed).resolve():
        return "harness"
    return typed if Path(typed).name == "harness" else "harness"
