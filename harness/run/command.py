"""`harness run`: run the suite for each selected cell and leave its results folder.

A cell always leaves ``results/<cell-id>/`` with ``env.json`` saying how it
ended, whatever went wrong (environment, busy GPU, crash, timeout), and one
cell's failure never stops the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

import harness
from harness import __version__, contract
from harness.cell import memory, preflight
from harness.contract import (
    ENV_JSON,
    INSTALL_LOG,
    JUNIT_XML,
    MEMORY_JSON,
    PYTEST_LOG,
    RANKS_LOG,
    RUNNING_TEST,
    RUNNING_TEST_ENV,
    STATUS_ERRORED,
    STATUS_FAILED,
    STATUS_NOT_RUN,
    STATUS_PASSED,
    EnvRecord,
)
from harness.engines import hostmemory
from harness.envs import cache as env_cache
from harness.envs.build import EnvironmentBuildError, ensure_environment, env_root, plan_environment, probe_versions
from harness.errors import ConfigError, HostMismatchError
from harness.plan.matrix import DEFAULT_MATRIX, Cell, Matrix, load_matrix, load_runners, select
from harness.project import find_project_root, git, resolve, shipped_matrices_dir
from harness.ranks import lifecycle
from harness.ranks.lifecycle import CELL_TOKEN_ENV, kill_cell_processes
from harness.results import nothing_distributed_ran, read_junit_tests

# Memory other processes may hold on a cell's GPUs before the cell refuses to start.
BUSY_THRESHOLD_MIB = float(os.environ.get("HARNESS_BUSY_THRESHOLD_MIB", "2048"))
# After the cell's timeout pytest gets SIGINT (it still writes junit.xml), then this long before SIGKILL.
INTERRUPT_GRACE_SECONDS = 20
# When harness itself is interrupted (SIGTERM, Ctrl-C) pytest gets SIGINT and this long before SIGKILL.
STOP_GRACE_SECONDS = 3
PLUGIN = "harness.ranks.plugin"
# harness run's exit status when no cell failed or errored but some ran nothing distributed (status not_run):
# not green, and told apart from 1 (failed or errored) and from the FatalErrors' 2-5.
EXIT_NOT_RUN = 6


class Interrupted(BaseException):  # a signal, like KeyboardInterrupt: `except Exception` lets it through
    """harness run got SIGTERM or SIGINT: the cell stops, its folder says so, and harness exits 128+signal."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
# A refusal names at most this many distinct reasons; the rest are counted.
REFUSAL_REASONS_SHOWN = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class Host:
    """What this machine offers: its visible GPUs (empty on a CPU-only machine) and their type."""

    gpus: tuple[memory.GpuIdentity, ...]
    gpu_type: str | None
    driver: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellOutcome:
    cell: Cell
    folder: Path
    status: str
    error: str | None
    duration_s: float


def command(args) -> int:
    host = detect_host()
    matrix = load_matrix(args.matrix) if args.matrix else default_matrix(host)
    cells = select(matrix.cells, args.cell)
    if not cells:
        raise ConfigError(f"{matrix.path}: no cell matches --cell {' '.join(args.cell or [])}")
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
    if args.dry_run:
        print_plan(matrix, cells, host, results_root, root, args.pytest_args, refused)
        return 0
    preflight.prepare_results(results_root, f"--results {args.results}")
    preflight.clear_earlier_run(results_root, [cell.id for cell in cells], args.pytest_args)
    try:
        with interruptible(), harness_import_path() as import_path:
            outcomes = [run_cell(cell, host=host, results_root=results_root, env_dir=root,
                                 pytest_args=args.pytest_args, log=progress, project=matrix.root,
                                 matrix_reference=matrix.reference, import_path=import_path,
                                 prepare_environment=preflight.checking_pins(ensure_environment)) for cell in cells]
    except Interrupted as interrupted:
        print(f"harness: {interrupted}; the cell's folder says so", file=sys.stderr, flush=True)
        return 128 + interrupted.signum
    print_table([outcome.folder for outcome in outcomes])
    print_where(results_root)
    return exit_status([outcome.status for outcome in outcomes])


def exit_status(statuses: list[str]) -> int:
    """1 when a cell failed or errored; EXIT_NOT_RUN when none did but one ran nothing distributed; else 0."""
    if any(status not in (STATUS_PASSED, STATUS_NOT_RUN) for status in statuses):
        return 1
    return EXIT_NOT_RUN if STATUS_NOT_RUN in statuses else 0


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM and SIGINT raise `Interrupted` (once: a second signal waits for the cleanup the first began)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame) -> None:
        for each in (signal.SIGTERM, signal.SIGINT):
            signal.signal(each, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {each: signal.signal(each, interrupt) for each in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)


def results_folder(value: str, root: Path) -> Path:
    """--results taken from the project root, so every file a cell writes lands in one folder."""
    folder = resolve(value, root)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--results {value}: {folder} is a file; give a folder for the cells' results")
    return folder


def summarize_refusals(refused: dict[str, str]) -> str:
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
    if cell.is_cpu or cell.engine != "local":  # an engine's hosts are not this machine
        return None  # gloo ranks run anywhere
    if not host.gpus:
        return f"needs {cell.gpus} {cell.gpu} GPUs, this machine has none"
    if host.gpu_type != cell.gpu:
        return f"needs {cell.gpu} GPUs, this machine has {host.gpus[0].name}"
    if len(host.gpus) < cell.gpus:
        return f"needs {cell.gpus} GPUs, this machine has {len(host.gpus)}"
    return None


def run_cell(cell: Cell, *, host: Host, results_root: Path, env_dir: Path, pytest_args: list[str],
             log: Callable[[str], None], project: Path, matrix_reference: str,
             import_path: Path | None = None, prepare_environment: Callable = ensure_environment) -> CellOutcome:
    """`prepare_environment(cell, env_dir, log)` gives the cell its interpreter; bisect swaps in one
    that installs a package built from a commit on top of the cell's environment."""
    folder = results_root / cell.id
    if folder.exists():
        shutil.rmtree(folder)  # results of an earlier run of this cell would mix with these
    folder.mkdir(parents=True)
    started = time.time()
    # An engine's hosts are not this machine: each samples its own GPUs, merged when the job ends.
    gpus = list(host.gpus[: cell.gpus]) if not cell.is_cpu and cell.engine == "local" else []
    record = start_record(cell, host, gpus, started, project=project,
                          reproduce=reproduce_command(cell, matrix_reference), pytest_args=pytest_args)
    log(f"== {cell.id}: results in {folder}")
    memory_report = memory.MemoryReport.unavailable("cpu cell: no GPU" if cell.is_cpu else "no GPU was monitored")
    try:
        with (folder / INSTALL_LOG).open("w") as install_log:
            environment = prepare_environment(cell, env_dir, tee(install_log, log))
        env_cache.mark_used(environment.path)
        record["versions"].update({k: environment.versions.get(k) for k in
                                   ("python", "torch", "transformers", "accelerate", "cuda")})
        busy = memory.preflight(gpus, BUSY_THRESHOLD_MIB) if gpus else []
        if busy:
            record["error"], record["error_kind"] = "; ".join(busy), contract.ERROR_BUSY_GPUS
        else:
            monitor = memory.MemoryMonitor(gpus) if gpus else None
            if monitor:
                monitor.start()
            try:
                # A built environment lacks harness itself: its ranks plugin comes through import_path.
                extra_path = import_path if environment.origin != "current" else None
                if cell.engine != "local":
                    exit_code, cause = run_on_engine(cell, environment.python, folder, pytest_args, log,
                                                     project=project, import_path=extra_path, record=record)
                    if not cell.is_cpu:
                        memory_report = hostmemory.merge(folder, record.get("hosts") or [])
                else:
                    exit_code, timed_out = run_pytest(cell, environment.python, folder, gpus, pytest_args, log,
                                                      project=project, import_path=extra_path)
            finally:
                if monitor:
                    memory_report = monitor.stop()
            record["exit_code"] = exit_code
            if cell.engine != "local" and cause:  # the engine knows why (a host lost, scancel, NODE_FAIL)
                record["status"], record["error"], record["error_kind"] = STATUS_ERRORED, cause, contract.ERROR_ENGINE
            else:
                record["status"], record["error"], record["error_kind"] = classify(
                    cell, exit_code, cell.engine == "local" and timed_out, folder / JUNIT_XML)
    except EnvironmentBuildError as error:
        record["error"], record["error_kind"] = f"environment: {error}", contract.ERROR_ENVIRONMENT
    except Interrupted as interrupted:
        record["status"], record["error"] = STATUS_ERRORED, str(interrupted)
        record["error_kind"] = contract.ERROR_INTERRUPTED
        if record.get("job_id"):  # an engine's job: harness cancelled it on the way out
            record["error"] = f"cancelled: harness {interrupted}; {cell.engine} job {record['job_id']} cancelled"
        raise
    except Exception as error:
        record["error"], record["error_kind"] = f"harness: {type(error).__name__}: {error}", contract.ERROR_HARNESS
        raise
    finally:
        ended = time.time()
        record.update(end=iso(ended), duration_s=round(ended - started, 3))
        memory.write_memory_json(folder / MEMORY_JSON, memory_report)
        write_env_json(folder, record)
    if record["error"]:
        log(f"   {cell.id}: {record['status']}: {record['error']}")
    return CellOutcome(cell=cell, folder=folder, status=record["status"], error=record["error"],
                       duration_s=record["duration_s"])


def run_on_engine(cell: Cell, python: Path, folder: Path, pytest_args: list[str], log: Callable[[str], None], *,
                  project: Path, import_path: Path | None, record: dict) -> tuple[int | None, str]:
    """A cell across hosts: submitted to its engine, which starts `harness host` on each host and waits."""
    from harness.engines import jobset, slurm

    if cell.engine == "jobset":  # the image has the project and its environment: python, paths as in it
        return jobset.run_job(cell, folder=folder, log=log, record=record,
                              pytest_command=pytest_command(cell, Path("python"), folder, pytest_args))
    return slurm.run_job(cell, folder=folder, pytest_command=pytest_command(cell, python, folder, pytest_args),
                         environ=pytest_environment(cell, [], import_path), project=project, log=log,
                         record=record)


def pytest_command(cell: Cell, python: Path, folder: Path, pytest_args: list[str]) -> list[str]:
    # -p: the ranks plugin's options must exist when pytest parses them, where harness is not installed in
    # the cell's environment (installed, its pytest11 entry point has the same name and is not loaded twice).
    # A test's captured output, its ranks' included, goes to its testcase in junit.xml (junit_logging) and is
    # shown with a failure; -r lists every outcome but not the passed tests' output (the P that -rA adds).
    command = [str(python), "-m", "pytest", *cell.suite, "-p", PLUGIN,
               "-p", "no:cacheprovider", "-o", "junit_family=xunit1", "-o", "junit_logging=all",
               f"--junitxml={folder / JUNIT_XML}", f"--ranks-log={folder / RANKS_LOG}",
               f"--timeout={cell.test_timeout_seconds}", "-rfEsxXp"]
    if cell.reruns:
        command.append(f"--reruns={cell.reruns}")
    return command + list(pytest_args)


def pytest_environment(cell: Cell, gpus: list, import_path: Path | None = None) -> dict[str, str]:
    environ = dict(os.environ)
    if import_path is not None:
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(import_path), environ.get("PYTHONPATH")]))
    # No bytecode written: a cached environment stays as built, so its manifest check passes next time.
    environ.update(HARNESS_CELL_ID=cell.id, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    if cell.is_cpu:
        environ["HARNESS_CPU_RANKS"] = str(cell.gpus)
        environ["CUDA_VISIBLE_DEVICES"] = ""  # a cpu cell means gloo, even on a GPU machine
    else:
        # UUIDs name exactly the GPUs the monitor watches, whatever order CUDA enumerates in.
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu.uuid for gpu in gpus)
        environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return environ


def run_pytest(cell: Cell, python: Path, folder: Path, gpus: list, pytest_args: list[str],
               log: Callable[[str], None], *, project: Path, import_path: Path | None = None,
               echo: Callable[[bytes], None] | None = None) -> tuple[int | None, bool]:
    """Runs the suite from the project root, streaming its output as it comes to pytest.log and the
    terminal. Returns (exit code, timed out).

    Every process of the cell carries a token in its environment and writes temporary files under a folder
    of its own; on every way out, whatever still carries the token is killed and the folder removed."""
    command = pytest_command(cell, python, folder, pytest_args)
    log("   " + shlex.join(command))
    token = uuid.uuid4().hex
    temporary = tempfile.mkdtemp(prefix="harness-cell-")
    environ = {**pytest_environment(cell, gpus, import_path), CELL_TOKEN_ENV: token, "TMPDIR": temporary,
               RUNNING_TEST_ENV: str(folder / RUNNING_TEST)}
    # Orphans of the cell come to this process while it runs, so one that dropped the token still ends with it.
    before = lifecycle.descendants(os.getpid())
    adopting = lifecycle.adopt_orphans(True)
    try:
        with (folder / PYTEST_LOG).open("wb") as pytest_log:
            process = subprocess.Popen(command, cwd=project, env=environ,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       start_new_session=True)  # its own group, so a timeout kills every rank
            reader = threading.Thread(target=stream_output,
                                      args=(process.stdout, pytest_log, echo or echo_terminal), daemon=True)
            reader.start()
            timed_out = False
            try:
                process.wait(timeout=cell.timeout_minutes * 60)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop_group(process)
            except Interrupted:
                _stop_group(process, interrupt_grace=STOP_GRACE_SECONDS)
                raise
            finally:
                _kill_leftovers(process, token)
                if adopting:
                    lifecycle.kill_new_descendants(before)
                reader.join(timeout=10)
    finally:
        if adopting:
            lifecycle.adopt_orphans(False)
        shutil.rmtree(temporary, ignore_errors=True)
    return process.returncode, timed_out


JUNIT_SCAN_BYTES = 64 * 1024 * 1024
# pytest's exit codes past 1: its words, and the kind of error (2 is also a collection error: see classify).
PYTEST_EXITS = {2: ("interrupted", contract.ERROR_INTERRUPTED), 3: ("internal error", contract.ERROR_PYTEST),
                4: ("usage error", contract.ERROR_PYTEST), 5: ("no tests collected", contract.ERROR_NO_TESTS)}


def classify(cell: Cell, exit_code: int | None, timed_out: bool, junit: Path) -> tuple[str, str | None, str | None]:
    """(status, error, error_kind) from how pytest ended. Failed tests are 'failed'; anything else abnormal
    is 'errored'; a clean run where cases were skipped for too few GPUs or ranks and no distributed case ran is
    'not_run' (from the cases' typed properties in junit.xml, read as the reports read them)."""
    if timed_out:
        return STATUS_ERRORED, f"timed out after {cell.timeout_minutes} min; killed", contract.ERROR_TIMEOUT
    if exit_code is not None and exit_code < 0:
        return (STATUS_ERRORED, f"pytest crashed: killed by signal {signal.Signals(-exit_code).name}",
                contract.ERROR_SIGNAL)
    if not junit.is_file() or junit.stat().st_size == 0:
        return STATUS_ERRORED, f"pytest exited {exit_code} and wrote no junit.xml", contract.ERROR_NO_JUNIT
    if exit_code == 0:
        return (STATUS_NOT_RUN if nothing_distributed_ran(read_junit_tests(junit)) else STATUS_PASSED), None, None
    if exit_code == 1:
        return STATUS_FAILED, None, None
    words, kind = PYTEST_EXITS.get(exit_code, ("unexpected exit", contract.ERROR_PYTEST))
    if exit_code == 2 and _collection_failed(junit):
        words, kind = "errors during collection", contract.ERROR_COLLECTION
    return STATUS_ERRORED, f"pytest exited {exit_code} ({words}); see pytest.log", kind


def _collection_failed(junit: Path) -> bool:
    """pytest's junitxml marks a module that did not collect with message="collection failure"."""
    try:
        if junit.stat().st_size > JUNIT_SCAN_BYTES:  # written by the tested code's run: bounded
            return False
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return False
    return any(error.get("message") == "collection failure" for error in root.iter("error"))


def print_plan(matrix: Matrix, cells: list[Cell], host: Host, results_root: Path, root: Path,
               pytest_args: list[str], refused: dict[str, str]) -> None:
    where = f"{len(host.gpus)} x {host.gpus[0].name}" if host.gpus else "no GPU"
    print(f"matrix {matrix.name} ({matrix.path}); project {matrix.root}; this machine: {where}")
    for cell in cells:
        if cell.id in refused:
            print(f"{cell.id}\n  would be refused: {refused[cell.id]}")
            continue
        try:
            origin, python, path = plan_environment(cell, root)
        except EnvironmentBuildError as error:
            origin, python, path = f"unusable ({error})", Path(sys.executable), None
        building = f"build {path}"
        if origin == "build":
            problem = preflight.pin_problem(cell, root)
            building = (f"cannot build {path}: {problem} (the cell would be errored at once)" if problem
                        else f"{building} ({env_cache.build_reason(cell, root)})")
        environment = {"current": "this interpreter", "cached": f"cached {path}", "build": building}
        print(f"{cell.id}")
        print(f"  environment: {environment.get(origin, origin)}")
        print(f"  results:     {results_root / cell.id}")
        print(f"  command:     {shlex.join(pytest_command(cell, python, results_root / cell.id, pytest_args))}")
    if refused:
        print(f"this machine cannot host {len(refused)} of {len(cells)} cells: {summarize_refusals(refused)}; "
              "harness run would stop with exit 3 (pick others with --cell, or pass --force)")


def print_table(folders: list[Path]) -> None:
    from harness.report.render import render
    from harness.report.terminal import wants_color
    from harness.results import load_results

    print(render(load_results([str(folder) for folder in folders]), "terminal", color=wants_color(sys.stdout)))


def print_where(results_root: Path) -> None:
    print(f"results: {results_root}")
    print(f"render:  {shlex.quote(this_command())} report {shlex.quote(str(results_root))} -o harness-report.html")


def this_command() -> str:
    """How the user ran harness: `harness` where PATH finds this very script, else the path they typed
    (`.venv/bin/harness`), so the hint runs as printed."""
    typed = sys.argv[0] if sys.argv and sys.argv[0] else "harness"
    found = shutil.which("harness")
    if Path(typed).name == "harness" and found and Path(found).resolve() == Path(typed).resolve():
        return "harness"
    return typed if Path(typed).name == "harness" else "harness"


def start_record(cell: Cell, host: Host, gpus: list, started: float, *, project: Path, reproduce: str,
                 pytest_args: list[str]) -> dict:
    """env.json as a cell starts (status errored until it says otherwise); its keys are EnvRecord's."""
    record = EnvRecord(
        cell=cell.to_json(),
        versions={"python": None, "torch": None, "transformers": None, "accelerate": None, "cuda": None,
                  "harness": __version__},
        gpus=[gpu.to_json() for gpu in gpus], driver=host.driver, host=socket.gethostname(),
        runner=os.environ.get("RUNNER_NAME"), git_sha=git_sha(project), git_dirty=git_dirty(project),
        trigger_sha=os.environ.get("GITHUB_SHA") or None, start=iso(started), reproduce=reproduce,
        pytest_args=list(pytest_args), engine=cell.engine,
    )
    return record.to_json()


def write_env_json(folder: Path, record: dict) -> None:
    # Through the frozen record: a key the contract does not name fails here, not in a later report.
    (folder / ENV_JSON).write_text(json.dumps(EnvRecord(**record).to_json(), indent=2) + "\n")


def reproduce_command(cell: Cell, matrix_reference: str) -> str:
    """What reruns this cell alone, from the project root: the matrix as it was named. pytest's arguments are
    env.json's `pytest_args`, so a report adds its failing tests to them instead of to a string."""
    matrix = f"--matrix {shlex.quote(matrix_reference)} " if matrix_reference != "local" else ""
    return f"harness run {matrix}--cell {shlex.quote(cell.id)}"


def git_sha(project: Path) -> str | None:
    """The commit checked out in the tested repository: what ran. ($GITHUB_SHA is the commit the workflow was
    started for, which for an issue_comment run is the default branch's head, not the pull request's; it is
    recorded apart as trigger_sha.)"""
    return (git(project, "rev-parse", "HEAD") or "").strip() or None


def git_dirty(project: Path) -> bool | None:
    """Whether tracked files differ from HEAD, so git_sha alone does not say what ran; None where unknown."""
    status = git(project, "status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status.strip())


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


def iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="seconds")


def progress(line: str) -> None:
    print(line, flush=True)


def tee(stream, log: Callable[[str], None]) -> Callable[[str], None]:
    def write(line: str) -> None:
        stream.write(line + "\n")
        stream.flush()
        log(line)

    return write


def stream_output(source, log_file, echo: Callable[[bytes], None]) -> None:
    """Copies pytest's output as it arrives, not a line at a time: its progress dots for one test file
    are one line, which on a long GPU cell would leave the terminal silent for minutes."""
    terminal_open = True
    while chunk := os.read(source.fileno(), 65536):
        log_file.write(chunk)
        log_file.flush()
        if terminal_open:
            try:
                echo(chunk)
            except OSError:
                terminal_open = False  # the terminal went away; pytest.log still gets everything


def echo_terminal(chunk: bytes) -> None:
    sys.stdout.flush()  # harness's own lines come first
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
        return
    buffer.write(chunk)
    buffer.flush()


def _kill_leftovers(process: subprocess.Popen, token: str) -> None:
    """Ranks orphaned by a crashed pytest still hold GPUs; no process of the cell outlives it. Ranks lead
    process groups of their own, so the token finds them, not pytest's group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    kill_cell_processes(token)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def _stop_group(process: subprocess.Popen, interrupt_grace: float | None = None) -> None:
    """SIGINT first so pytest still writes junit.xml, then SIGKILL for every process in the group."""
    interrupt_grace = INTERRUPT_GRACE_SECONDS if interrupt_grace is None else interrupt_grace
    for sig, grace in ((signal.SIGINT, interrupt_grace), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            if sig == signal.SIGINT:
                os.killpg(process.pid, signal.SIGKILL)  # ranks that ignored the interrupt
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return
