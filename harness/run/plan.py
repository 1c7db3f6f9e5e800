"""The plan stage of `harness run`: which cells run, where their results go.

Takes the command's arguments (--matrix, --cell, --reruns, --force, --results, --env-dir, pytest's own) and
this machine (`detect_host`); hands on a `Plan`: the selected cells, the machine, the cells it cannot host,
the results folder and the environments' folder. It checks, before anything is written, that the cells'
suites exist and that this machine can host every cell (else HostMismatchError, exit 3; a dry run only
says so).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from harness.cell import memory, preflight
from harness.containment import cgroup
from harness.engines import check_settings, engine
from harness.envs.build import env_root, probe_versions
from harness.errors import ConfigError, HostMismatchError
from harness.plan.cells import Cell, Matrix, Runner
from harness.plan.matrix import DEFAULT_MATRIX, load_matrix, select
from harness.plan.packing import job_cells, plan_jobs
from harness.plan.runners import load_runners
from harness.project import find_project_root, results_path, shipped_matrices_dir

# A refusal names at most this many distinct reasons; the rest are counted.
REFUSAL_REASONS_SHOWN = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class Host:
    """What this machine offers: its visible GPUs (empty on a CPU-only machine) and their type."""

    gpus: tuple[memory.GpuIdentity, ...]
    gpu_type: str | None
    driver: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """What `harness run` will do: each cell in `cells` walks down prepare, execute and record in turn."""

    matrix: Matrix
    cells: tuple[Cell, ...]  # selected by --job and --cell, with --reruns applied
    host: Host  # this machine
    refused: Mapping[str, str]  # cell id -> why this machine cannot host it (empty with --force)
    results_root: Path  # --results, from the project root: every cell's folder goes in it
    env_dir: Path  # where the cells' environments are cached
    pytest_args: tuple[str, ...]  # the run's own, after `--`
    runners: Mapping[str, Runner] = dataclasses.field(default_factory=dict)  # which types pack (run.packed)
    pack_tests: bool = True  # a cell on one host runs its tests several at once where they fit (harness.ranks.packing)


def plan(args) -> Plan:
    host = detect_host()
    matrix = load_matrix(args.matrix) if args.matrix else default_matrix(host)
    runners = load_runners(matrix.root, beside=matrix.path.parent)
    # --job: the cells of one job of `harness matrix --format github` (a pack's), packed again from the matrix.
    cells = job_cells(plan_jobs(matrix.cells, runners), args.job, str(matrix.path)) if args.job else matrix.cells
    cells = select(cells, args.cell)
    if not cells:
        raise ConfigError(f"{matrix.path}: no cell matches --cell {' '.join(args.cell or [])}")
    check_settings(cells)
    cgroup.wanted(os.environ)  # a bad $HARNESS_CELL_CGROUP stops the run before any cell, not after the first
    if args.reruns is not None:
        if args.reruns < 0:
            raise ConfigError(f"--reruns {args.reruns}: expected a whole number >= 0")
        cells = [dataclasses.replace(cell, reruns=args.reruns) for cell in cells]
    refused = {cell.id: why for cell in cells if (why := unfit_reason(cell, host))} if not args.force else {}
    if refused and not args.dry_run:
        raise HostMismatchError(f"this machine cannot host {len(refused)} of {len(cells)} cells: "
                                f"{summarize_refusals(refused)}; pick others with --cell, or pass --force")
    results_root = results_folder(args.results, matrix.root)
    root = env_root(args.env_dir)
    preflight.check_project(matrix.project, [(suite_origin(matrix, named=bool(args.matrix)), cell.suite)
                                             for cell in cells])
    return Plan(matrix=matrix, cells=tuple(cells), host=host, refused=refused, results_root=results_root,
                env_dir=root, pytest_args=tuple(args.pytest_args), runners=runners,
                pack_tests=not getattr(args, "serial_tests", False))


def results_folder(value: str, root: Path) -> Path:
    """--results taken from the project root, so every file a cell writes lands in one folder."""
    folder = results_path(value, root)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--results {value}: {folder} is a file; give a folder for the cells' results")
    return folder


def summarize_refusals(refused: Mapping[str, str]) -> str:
    """'needs 2 h200 GPUs, this machine has none (12 cells: h200-2gpu-..., ...)', a few reasons at most."""
    by_reason: dict[str, list[str]] = {}
    for cell_id, why in refused.items():
        by_reason.setdefault(why, []).append(cell_id)
    parts = []
    for why, ids in list(by_reason.items())[:REFUSAL_REASONS_SHOWN]:
        parts.append(f"{why} ({ids[0]})" if len(ids) == 1 else f"{why} ({len(ids)} cells: {ids[0]}, ...)")
    if len(by_reason) > REFUSAL_REASONS_SHOWN:
        parts.append(f"{len(by_reason) - REFUSAL_REASONS_SHOWN} more reasons")
    return "; ".join(parts)


def detect_host() -> Host:
    try:
        gpus = tuple(memory.resolve_gpus(os.environ.get("CUDA_VISIBLE_DEVICES")))
    except memory.NvmlUnavailable:
        gpus = ()  # no NVML: a CPU-only machine as far as harness can tell
    gpu_type = None
    if gpus:
        runners = load_runners()
        gpu_type = next((name for name, runner in runners.items()
                         if runner.nvml_name and gpus[0].name.startswith(runner.nvml_name)), None)
    return Host(gpus=gpus, gpu_type=gpu_type, driver=memory.driver_version() if gpus else None)


def default_matrix(host: Host) -> Matrix:
    """No GPU: the cpu matrix. GPUs: one cell of this machine's GPUs with the installed releases."""
    if not host.gpus:
        return load_matrix(DEFAULT_MATRIX)
    if host.gpu_type is None:
        raise ConfigError(f"runners.yaml: no GPU type has nvml_name matching {host.gpus[0].name!r}; "
                          "add it to the repository's matrices/runners.yaml, or pass --matrix")
    installed = probe_versions(sys.executable)
    if not installed.get("torch") or not installed.get("transformers"):
        raise ConfigError("this interpreter has no torch or transformers to test; pass --matrix to build one")
    runner = load_runners()[host.gpu_type]
    cell = Cell(gpu=host.gpu_type, gpus=min(len(host.gpus), runner.gpus), matrix="local",
                torch=installed["torch"].split("+")[0], transformers=installed["transformers"].split("+")[0],
                labels=runner.labels, timeout_minutes=60, reruns=0, suite=("tests/gpu",))
    return Matrix(name="local", path=shipped_matrices_dir() / "runners.yaml", description="this machine's GPUs",
                  cells=(cell,), project=find_project_root(), reference="local")


def suite_origin(matrix: Matrix, *, named: bool) -> str:
    """Where the cells' suite entries come from, in words: the embedded default is no file of the user's (on GPUs
    its suite is written in no file at all, whatever its Matrix.path)."""
    if not named:
        return "the embedded default (no --matrix)" if matrix.reference == "local" else \
            f"the embedded default (no --matrix: {matrix.path})"
    return str(matrix.path)


def unfit_reason(cell: Cell, host: Host) -> str | None:
    if cell.is_cpu or not engine(cell.engine).runs_here:  # an engine's hosts are not this machine
        return None  # gloo ranks run anywhere
    if not host.gpus:
        return f"needs {cell.gpus} {cell.gpu} GPUs, this machine has none"
    if host.gpu_type != cell.gpu:
        return f"needs {cell.gpu} GPUs, this machine has {host.gpus[0].name}"
    if len(host.gpus) < cell.gpus:
        return f"needs {cell.gpus} GPUs, this machine has {len(host.gpus)}"
    return None
