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
import threading
import time
from collections.abc import Callable
from pathlib import Path

from harness import __version__, memory
from harness.env import EnvironmentBuildError, ensure_environment, env_root, plan_environment, probe_versions
from harness.errors import ConfigError, HostMismatchError
from harness.matrix import DEFAULT_MATRIX, REPO_ROOT, Cell, Matrix, load_matrix, load_runners, select

# Memory other processes may hold on a cell's GPUs before the cell refuses to start.
BUSY_THRESHOLD_MIB = float(os.environ.get("HARNESS_BUSY_THRESHOLD_MIB", "2048"))
# After the cell's timeout pytest gets SIGINT (it still writes junit.xml), then this long before SIGKILL.
INTERRUPT_GRACE_SECONDS = 20


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
    refused = [(cell, why) for cell in cells if (why := unfit_reason(cell, host))]
    if refused and not args.force:
        lines = "; ".join(f"{cell.id}: {why}" for cell, why in refused)
        raise HostMismatchError(f"this machine cannot host {len(refused)} of {len(cells)} cells ({lines}); "
                                "pick others with --cell, or pass --force")
    results_root = Path(args.results)
    root = env_root(args.env_dir)
    if args.dry_run:
        print_plan(matrix, cells, host, results_root, root, args.pytest_args)
        return 0
    outcomes = [run_cell(cell, host=host, results_root=results_root, env_dir=root,
                         pytest_args=args.pytest_args, log=progress) for cell in cells]
    print_table([outcome.folder for outcome in outcomes])
    return 0 if all(outcome.status == "passed" for outcome in outcomes) else 1


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
        raise ConfigError(f"matrices/runners.yaml: no GPU type has nvml_name matching {host.gpus[0].name!r}; "
                          "add it, or pass --matrix")
    installed = probe_versions(sys.executable)
    if not installed.get("torch") or not installed.get("transformers"):
        raise ConfigError("this interpreter has no torch or transformers to test; pass --matrix to build one")
    runner = load_runners()[host.gpu_type]
    cell = Cell(gpu=host.gpu_type, gpus=min(len(host.gpus), runner.gpus), matrix="local",
                torch=installed["torch"].split("+")[0], transformers=installed["transformers"].split("+")[0],
                labels=runner.labels, timeout_minutes=60, reruns=0, suite=("tests/gpu",))
    return Matrix(name="local", path=Path("matrices/runners.yaml"), description="this machine's GPUs",
                  cells=(cell,))


def unfit_reason(cell: Cell, host: Host) -> str | None:
    if cell.is_cpu:
        return None  # gloo ranks run anywhere
    if not host.gpus:
        return f"needs {cell.gpus} {cell.gpu} GPUs, this machine has none"
    if host.gpu_type != cell.gpu:
        return f"needs {cell.gpu} GPUs, this machine has {host.gpus[0].name}"
    if len(host.gpus) < cell.gpus:
        return f"needs {cell.gpus} GPUs, this machine has {len(host.gpus)}"
    return None


def run_cell(cell: Cell, *, host: Host, results_root: Path, env_dir: Path, pytest_args: list[str],
             log: Callable[[str], None], prepare_environment: Callable = ensure_environment) -> CellOutcome:
    """`prepare_environment(cell, env_dir, log)` gives the cell its interpreter; bisect swaps in one
    that installs a package built from a commit on top of the cell's environment."""
    folder = results_root / cell.id
    if folder.exists():
        shutil.rmtree(folder)  # results of an earlier run of this cell would mix with these
    folder.mkdir(parents=True)
    started = time.time()
    gpus = list(host.gpus[: cell.gpus]) if not cell.is_cpu else []
    record = {"schema": 1, "cell": cell.to_json(), "status": "errored", "error": None, "exit_code": None,
              "versions": {"python": None, "torch": None, "transformers": None, "accelerate": None,
                           "cuda": None, "harness": __version__},
              "gpus": [gpu.to_json() for gpu in gpus],
              "driver": host.driver, "host": socket.gethostname(), "runner": os.environ.get("RUNNER_NAME"),
              "git_sha": git_sha(), "git_dirty": git_dirty(), "start": iso(started), "end": None, "duration_s": None,
              "reproduce": reproduce_command(cell)}
    log(f"== {cell.id}")
    memory_report = memory.MemoryReport.unavailable("cpu cell: no GPU" if cell.is_cpu else "no GPU was monitored")
    try:
        with (folder / "install.log").open("w") as install_log:
            environment = prepare_environment(cell, env_dir, tee(install_log, log))
        record["versions"].update({k: environment.versions.get(k) for k in
                                   ("python", "torch", "transformers", "accelerate", "cuda")})
        busy = memory.preflight(gpus, BUSY_THRESHOLD_MIB) if gpus else []
        if busy:
            record["error"] = "; ".join(busy)
        else:
            monitor = memory.MemoryMonitor(gpus) if gpus else None
            if monitor:
                monitor.start()
            try:
                exit_code, timed_out = run_pytest(cell, environment.python, folder, gpus, pytest_args, log)
            finally:
                if monitor:
                    memory_report = monitor.stop()
            record["exit_code"] = exit_code
            record["status"], record["error"] = classify(cell, exit_code, timed_out, folder / "junit.xml")
    except EnvironmentBuildError as error:
        record["error"] = f"environment: {error}"
    except Exception as error:
        record["error"] = f"harness: {type(error).__name__}: {error}"
        raise
    finally:
        ended = time.time()
        record.update(end=iso(ended), duration_s=round(ended - started, 3))
        memory.write_memory_json(folder / "memory.json", memory_report)
        (folder / "env.json").write_text(json.dumps(record, indent=2) + "\n")
    if record["error"]:
        log(f"   {cell.id}: {record['status']}: {record['error']}")
    return CellOutcome(cell=cell, folder=folder, status=record["status"], error=record["error"],
                       duration_s=record["duration_s"])


def pytest_command(cell: Cell, python: Path, folder: Path, pytest_args: list[str]) -> list[str]:
    command = [str(python), "-m", "pytest", *cell.suite,
               "-p", "no:cacheprovider", "-o", "junit_family=xunit1", f"--junitxml={folder / 'junit.xml'}",
               f"--timeout={cell.test_timeout_seconds}", "-rA"]
    if cell.reruns:
        command.append(f"--reruns={cell.reruns}")
    return command + list(pytest_args)


def pytest_environment(cell: Cell, gpus: list) -> dict[str, str]:
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environ.get("PYTHONPATH")]))
    environ.update(HARNESS_CELL_ID=cell.id, PYTHONUNBUFFERED="1")
    if cell.is_cpu:
        environ["HARNESS_CPU_RANKS"] = str(cell.gpus)
        environ["CUDA_VISIBLE_DEVICES"] = ""  # a cpu cell means gloo, even on a GPU machine
    else:
        # UUIDs name exactly the GPUs the monitor watches, whatever order CUDA enumerates in.
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu.uuid for gpu in gpus)
        environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return environ


def run_pytest(cell: Cell, python: Path, folder: Path, gpus: list, pytest_args: list[str],
               log: Callable[[str], None]) -> tuple[int | None, bool]:
    """Runs the suite, streaming its output to pytest.log and the terminal. Returns (exit code, timed out)."""
    command = pytest_command(cell, python, folder, pytest_args)
    log("   " + shlex.join(command))
    with (folder / "pytest.log").open("w") as pytest_log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=pytest_environment(cell, gpus),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)  # its own group, so a timeout kills every rank
        reader = threading.Thread(target=_pump, args=(process.stdout, tee(pytest_log, log)), daemon=True)
        reader.start()
        timed_out = False
        try:
            process.wait(timeout=cell.timeout_minutes * 60)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_group(process)
        _kill_leftovers(process)
        reader.join(timeout=10)
    return process.returncode, timed_out


def classify(cell: Cell, exit_code: int | None, timed_out: bool, junit: Path) -> tuple[str, str | None]:
    """(status, error) from how pytest ended. Failed tests are 'failed'; anything else abnormal is 'errored'."""
    if timed_out:
        return "errored", f"timed out after {cell.timeout_minutes} min; killed"
    if exit_code is not None and exit_code < 0:
        return "errored", f"pytest crashed: killed by signal {signal.Signals(-exit_code).name}"
    if not junit.is_file() or junit.stat().st_size == 0:
        return "errored", f"pytest exited {exit_code} and wrote no junit.xml"
    if exit_code == 0:
        return "passed", None
    if exit_code == 1:
        return "failed", None
    reasons = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}
    return "errored", f"pytest exited {exit_code} ({reasons.get(exit_code, 'unexpected exit')}); see pytest.log"


def print_plan(matrix: Matrix, cells: list[Cell], host: Host, results_root: Path, root: Path,
               pytest_args: list[str]) -> None:
    where = f"{len(host.gpus)} x {host.gpus[0].name}" if host.gpus else "no GPU"
    print(f"matrix {matrix.name} ({matrix.path}); this machine: {where}")
    for cell in cells:
        try:
            origin, python, path = plan_environment(cell, root)
        except EnvironmentBuildError as error:
            origin, python, path = f"unusable ({error})", Path(sys.executable), None
        environment = {"current": "this interpreter", "cached": f"cached {path}", "build": f"build {path}"}
        print(f"{cell.id}")
        print(f"  environment: {environment.get(origin, origin)}")
        print(f"  results:     {results_root / cell.id}")
        print(f"  command:     {shlex.join(pytest_command(cell, python, results_root / cell.id, pytest_args))}")


def print_table(folders: list[Path]) -> None:
    from harness.report import render
    from harness.results import load_results

    print(render(load_results([str(folder) for folder in folders]), "terminal"))


def reproduce_command(cell: Cell) -> str:
    matrix = f"--matrix {shlex.quote(cell.matrix)} " if cell.matrix != "local" else ""
    return f"harness run {matrix}--cell {shlex.quote(cell.id)}"


def git_sha() -> str | None:
    if os.environ.get("GITHUB_SHA"):
        return os.environ["GITHUB_SHA"]
    return (_git("rev-parse", "HEAD") or "").strip() or None


def git_dirty() -> bool | None:
    """Whether tracked files differ from HEAD, so git_sha alone does not say what ran; None where unknown
    (Actions runs the checked-out GITHUB_SHA)."""
    if os.environ.get("GITHUB_SHA"):
        return None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status.strip())


def _git(*arguments: str) -> str | None:
    """git's output in the repository, or None where git is missing or fails."""
    try:
        done = subprocess.run(["git", *arguments], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


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


def _pump(source, sink: Callable[[str], None]) -> None:
    for line in source:
        sink(line.rstrip("\n"))


def _kill_leftovers(process: subprocess.Popen) -> None:
    """Ranks orphaned by a crashed pytest still hold GPUs; no process of the cell outlives it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _stop_group(process: subprocess.Popen) -> None:
    """SIGINT first so pytest still writes junit.xml, then SIGKILL for every process in the group."""
    for sig, grace in ((signal.SIGINT, INTERRUPT_GRACE_SECONDS), (signal.SIGKILL, 10)):
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
