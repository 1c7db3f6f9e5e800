"""The prepare stage of `harness run`: the results folder, and each cell's folder, env.json and environment.

`prepare_run(plan)` checks once that the results folder takes files and keeps what an earlier run left there
aside (earlier.py). `prepare_cell` takes one cell of the plan: it empties and makes the cell's folder, begins its
env.json (the cell, this machine, the commit, the start: an `EnvRecord` that says errored until the record stage
says otherwise), builds or finds the cell's environment (install.log) and refuses GPUs other processes hold. It
hands on `Prepared`: the record so far and, when the cell can run, the engine's `Launch` and its GPUs' locks
(harness.cell.gpulock: no other harness run on this host uses them meanwhile); when it cannot, the
record says why; when harness was interrupted or failed here, `raised` carries it on to be recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import harness
from harness import __version__, contract
from harness.cell import gpulock, memory, preflight
from harness.contract import INSTALL_LOG, EnvRecord
from harness.engines import Launch, engine
from harness.environment import BUSY_THRESHOLD_MIB_ENV
from harness.envs import cache as env_cache
from harness.envs.build import EnvironmentBuildError
from harness.plan.cells import Cell
from harness.project import git
from harness.run import earlier
from harness.run.plan import Host, Plan

# Memory other processes may hold on a cell's GPUs before the cell refuses to start.
BUSY_THRESHOLD_MIB = float(os.environ.get(BUSY_THRESHOLD_MIB_ENV, "2048"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prepared:
    """One cell, its folder made and its env.json begun; `launch` when it can run."""

    cell: Cell
    folder: Path
    started: float  # time.time() as the cell began
    record: EnvRecord  # env.json so far: the environment's versions once it is ready, `error` where it cannot run
    launch: Launch | None  # what its engine is handed; None: the cell does not run (record.error, or raised)
    raised: BaseException | None = None  # an interruption or a harness failure: recorded, then raised again
    gpu_locks: gpulock.GpuLocks | None = None  # its GPUs' locks, held until the execute stage ends


def prepare_run(plan: Plan, results_option: str, *, keep_others: bool = True) -> earlier.KeptRun:
    """Before any cell: the results folder takes files, and what an earlier run left there is kept aside
    (harness.run.earlier). `keep_others` False: a cell of a pack, whose neighbours write their folders beside its
    own (the run that started the pack kept the earlier run aside)."""
    preflight.prepare_results(plan.results_root, results_option)
    if not keep_others:
        return earlier.KeptRun(results_root=plan.results_root)
    return earlier.keep_aside(plan.results_root, [cell.id for cell in plan.cells], list(plan.pytest_args),
                              results_option)


def prepare_cell(cell: Cell, *, host: Host, results_root: Path, env_dir: Path, pytest_args: list[str] | tuple[str, ...],
                 log: Callable[[str], None], project: Path, matrix_reference: str, import_path: Path | None = None,
                 prepare_environment: Callable = preflight.prepare_environment, pack_tests: bool = False) -> Prepared:
    """`prepare_environment(cell, env_dir, log)` gives the cell its interpreter; bisect swaps in one
    that installs a package built from a commit on top of the cell's environment."""
    folder = results_root / cell.id
    if folder.exists():
        shutil.rmtree(folder)  # results of an earlier run of this cell would mix with these
    folder.mkdir(parents=True)
    started = time.time()
    # An engine's hosts are not this machine: each samples its own GPUs, merged when the job ends.
    gpus = tuple(host.gpus[: cell.gpus]) if not cell.is_cpu and engine(cell.engine).runs_here else ()
    record = start_record(cell, host, list(gpus), started, project=project,
                          matrix_reference=matrix_reference, pytest_args=pytest_args)
    log(f"== {cell.id}: results in {folder}")
    prepared = Prepared(cell=cell, folder=folder, started=started, record=record, launch=None)
    try:
        with (folder / INSTALL_LOG).open("w") as install_log:
            environment = prepare_environment(cell, env_dir, tee(install_log, log))
        env_cache.mark_used(environment.path)
        versions = {**record.versions, **{k: environment.versions.get(k) for k in
                                          ("python", "torch", "transformers", "accelerate", "cuda")}}
        prepared = dataclasses.replace(prepared, record=dataclasses.replace(record, versions=versions))
        locks = gpulock.try_lock(gpu.uuid for gpu in gpus) if gpus else None
        if isinstance(locks, str):  # another harness run on this host holds one of them
            return _cannot_run(prepared, locks, contract.ERROR_BUSY_GPUS)
        busy = memory.preflight(list(gpus), BUSY_THRESHOLD_MIB) if gpus else []
        if busy:
            if locks is not None:
                locks.release()
            return _cannot_run(prepared, "; ".join(busy), contract.ERROR_BUSY_GPUS)
        # A built environment lacks harness itself: its ranks plugin comes through import_path.
        launch = Launch(cell=cell, folder=folder, python=environment.python, pytest_args=tuple(pytest_args),
                        project=project, import_path=import_path if environment.origin != "current" else None,
                        gpus=gpus, log=log, pack_tests=pack_tests)
        return dataclasses.replace(prepared, launch=launch, gpu_locks=locks)
    except EnvironmentBuildError as error:
        return _cannot_run(prepared, f"environment: {error}", contract.ERROR_ENVIRONMENT)
    except BaseException as error:  # an interruption, a harness failure: recorded by the record stage, then raised
        return dataclasses.replace(prepared, raised=error)


def _cannot_run(prepared: Prepared, error: str, kind: str) -> Prepared:
    return dataclasses.replace(prepared, record=dataclasses.replace(prepared.record, error=error, error_kind=kind))


def start_record(cell: Cell, host: Host, gpus: list, started: float, *, project: Path, matrix_reference: str,
                 pytest_args: list[str] | tuple[str, ...]) -> EnvRecord:
    """env.json as a cell starts (status errored until it says otherwise). What reruns the cell goes in as typed
    fields (the matrix as it was named, the cell, pytest's arguments), never as a command line: a report rebuilds
    that from them, checked, since the folder also holds what the code under test wrote."""
    return EnvRecord(
        cell=cell.to_json(),
        versions={"python": None, "torch": None, "transformers": None, "accelerate": None, "cuda": None,
                  "harness": __version__},
        gpus=[gpu.to_json() for gpu in gpus], driver=host.driver, host=socket.gethostname(),
        runner=os.environ.get("RUNNER_NAME"), git_sha=git_sha(project), git_dirty=git_dirty(project),
        trigger_sha=os.environ.get("GITHUB_SHA") or None, start=iso(started), matrix_reference=matrix_reference,
        pytest_args=list(pytest_args), engine=cell.engine,
    )


def git_sha(project: Path) -> str | None:
    """The commit checked out in the tested repository: what ran. ($GITHUB_SHA is the commit the workflow was
    started for, which for an issue_comment run is the default branch's head, not the pull request's; it is
    recorded apart as trigger_sha.)"""
    return (git(project, "rev-parse", "HEAD") or "").strip() or None


def git_dirty(project: Path) -> bool | None:
    """Whether tracked files differ from HEAD, so git_sha alone does not say what ran; None where unknown."""
    status = git(project, "status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status.strip())


def iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="seconds")


def tee(stream, log: Callable[[str], None]) -> Callable[[str], None]:
    def write(line: str) -> None:
        stream.write(line + "\n")
        stream.flush()
        log(line)

    return write


@contextlib.contextmanager
def harness_import_path() -> Iterator[Path]:
    """A folder holding only this harness (its package and, where installed, its metadata with the pytest
    plugin entry point), for PYTHONPATH of a cell environment that does not have harness installed.
    The folder around the package is not used: installed, it is a site-packages whose torch would
    shadow the cell's."""
    with tempfile.TemporaryDirectory(prefix="harness-import-") as folder:
        package = Path(harness.__file__).resolve().parent
        (Path(folder) / "harness").symlink_to(package, target_is_directory=True)
        metadata = _distribution_metadata()
        if metadata is not None:
            (Path(folder) / metadata.name).symlink_to(metadata, target_is_directory=True)
        yield Path(folder)


def _distribution_metadata() -> Path | None:
    import importlib.metadata

    try:
        distribution = importlib.metadata.distribution("harness")
    except importlib.metadata.PackageNotFoundError:
        return None  # run from a checkout on PYTHONPATH: the suite's conftest registers the plugin itself
    for file in distribution.files or ():
        if file.name == "METADATA" and file.parent.name.endswith(".dist-info"):
            return Path(str(distribution.locate_file(file))).resolve().parent
    return None
