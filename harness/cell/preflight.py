"""What `harness run` checks and prepares before any cell runs, so a mistake is one line, not a red cell.

- The project root: outside a git repository the working directory is taken as the project, which is
  said, since env.json then records no commit and relative paths resolve from there.
- The pins: a torch or transformers version a cell would build an environment for must be on the
  package index, or the cell is errored at once with that reason, not after half a minute of a failing
  install (cells that use this interpreter or a cached environment ask nothing, so they run offline).
- The suites: a path a matrix names that is not there would make every cell "pytest exited 4 (usage
  error)" with the cause only in pytest.log.
- The results folder: it must take files. (It holds one run's cells only: harness.run.earlier keeps an
  earlier run's aside, and `earlier_was_full_run` tells it when a selection takes a full run's place.)
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from harness.contract import ENV_JSON
from harness.envs.build import Environment, EnvironmentBuildError, EnvSpec, ensure_environment, plan_environment
from harness.errors import ConfigError
from harness.plan.cells import Cell
from harness.plan.pins import missing_pins
from harness.plan.versions import VersionLookupError
from harness.project import ProjectRoot, resolve


def warn(message: str) -> None:
    print(f"harness: warning: {message}", file=sys.stderr, flush=True)


def check_project(project: ProjectRoot, suites: Iterable[tuple[str, tuple[str, ...]]],
                  say: Callable[[str], None] = warn) -> None:
    """`suites`: (where the cells' suite comes from, in words, and its entries) per cell."""
    if not project.in_git:
        say(f"{project.path} is not in a git repository: it is taken as the project root and env.json records "
            "no commit")
    for origin, entries in suites:
        # An entry may name a test inside a file (tests/gpu/test_ep.py::test_load): the file must exist.
        looked_for = {entry: resolve(entry.split("::")[0], project.path) for entry in entries}
        missing = {entry: path for entry, path in looked_for.items() if not path.exists()}
        if missing:
            raise ConfigError(
                f"suite {', '.join(missing)} of {origin} not found: looked for "
                f"{' and '.join(str(path) for path in missing.values())}, resolving against the project root "
                f"{project.path} ({project.found_as})"
            )


def environment_spec(cell: Cell) -> EnvSpec:
    """What harness.envs builds the cell's environment from (it knows no Cell)."""
    return EnvSpec(torch=cell.torch, transformers=cell.transformers, install=cell.install)


def prepare_environment(cell: Cell, env_dir: Path, log: Callable[[str], None]) -> Environment:
    """`prepare_environment` for run_cell: the cell's cached (or built) environment."""
    return ensure_environment(environment_spec(cell), env_dir, log)


def pin_problem(cell: Cell, env_dir: Path) -> str | None:
    """Why the cell's environment cannot be built (a pin the index lacks), asked only of a cell that would
    build; None when it would not build or its pins exist."""
    try:
        would_build = plan_environment(environment_spec(cell), env_dir)[0] == "build"
    except EnvironmentBuildError:
        would_build = True
    if not would_build:
        return None
    try:
        problems = missing_pins([cell])
    except VersionLookupError:
        return None  # the index cannot be asked (offline, or an installer cache only): the build decides
    return "; ".join(problems) or None


def checking_pins(prepare: Callable) -> Callable:
    """`prepare_environment` for run_cell that first checks the cell's pins: a missing one makes the cell
    errored at once with that reason (the other cells still run), before anything is built."""
    def prepare_checked(cell: Cell, env_dir: Path, log: Callable[[str], None]):
        problem = pin_problem(cell, env_dir)
        if problem:
            raise EnvironmentBuildError(problem)
        return prepare(cell, env_dir, log)

    return prepare_checked


def prepare_results(results_root: Path, option: str) -> None:
    """The folder exists and takes files: a read-only one is one line here, not a traceback mid-run."""
    try:
        results_root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=results_root, prefix=".harness-write-check-"):
            pass
    except OSError as error:
        raise ConfigError(f"{option}: cannot write to {results_root}: {error.strerror or error}") from None


def earlier_was_full_run(folder: Path) -> bool:
    """Whether the folder holds a run without pytest arguments: env.json's `pytest_args` is empty (in a folder
    written before that field, its reproduce command has no ` -- `). The file is untrusted: anything unreadable
    counts as not full."""
    try:
        record = json.loads((folder / ENV_JSON).read_text(encoding="utf-8")[:100_000])
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict):
        return False
    if record.get("pytest_args") is not None:
        return record["pytest_args"] == []
    reproduce = record.get("reproduce")
    return isinstance(reproduce, str) and " -- " not in reproduce
