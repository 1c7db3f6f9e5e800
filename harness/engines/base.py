"""What every engine is handed and hands back, and the one pytest command line they all start.

`harness run`'s execute stage looks a cell's engine up by runners.yaml's `engine:` (harness.engines.REGISTRY)
and calls `run(launch, job)`: the engine starts the cell's pytest on its hosts, waits, and returns `Ran`.
While it runs it fills `job` (the job's id, its hosts) so that what it knew is recorded even when harness
is interrupted and the engine raises `Interrupted` on the way out.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict

from harness import contract
from harness.contract import HOST_LOST_JSON, JUNIT_XML, RANKS_LOG, CleanupRecord
from harness.engines.interruption import Interrupted, interruptible  # noqa: F401 (engines raise it; runs open it)
from harness.environment import CELL_ID_ENV, CPU_RANKS_ENV
from harness.errors import ConfigError
from harness.plan.files import reject_unknown_keys

if TYPE_CHECKING:
    from harness.cell.gpus import GpuIdentity
    from harness.cell.memory import MemoryReport
    from harness.plan.cells import Cell, SubmitOptions

PLUGIN = "harness.ranks.plugin"


def submitted(options: SubmitOptions | None, settings_type: type) -> dict:
    """runners.yaml's `submit:` as written, refused where a key is no field of the engine's `settings_type`; {}
    where the runner has none."""
    if options is None:
        return {}
    given = options.as_dict()
    reject_unknown_keys(given, [field.name for field in dataclasses.fields(settings_type)], options.where)
    return given


def word(value: object, where: str) -> str:
    """A setting that goes on a command line or into a manifest: one word, no spaces."""
    if not isinstance(value, str) or not value or any(ch.isspace() for ch in value):
        raise ConfigError(f"{where}: expected a word without spaces, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Launch:
    """One cell, ready to run: its folder made, its environment's interpreter, what pytest gets."""

    cell: Cell
    folder: Path  # results/<cell-id>/: every file of the cell lands here
    python: Path  # the cell environment's interpreter (an engine whose hosts have their own may ignore it)
    pytest_args: tuple[str, ...]  # the run's own, after `--`
    project: Path  # the tested repository: pytest runs from it
    import_path: Path | None  # this harness, for an environment that lacks it (None: it has it)
    gpus: tuple[GpuIdentity, ...]  # this machine's GPUs the cell runs on: none for a cpu cell or an engine's hosts
    log: Callable[[str], None]  # harness's lines to the terminal
    pack_tests: bool = False  # several tests at once on this host's GPUs or cores (an engine that runs here)


@dataclasses.dataclass(frozen=True)
class EngineCause:
    """Why an engine ended a cell in error: its kind (one of contract.ERROR_KINDS, env.json's `error_kind`: what
    triage and bisect read) and its words (env.json's `error`, for people). The engine that saw the event types it;
    nothing reads the words back."""

    kind: str
    words: str

    def __str__(self) -> str:
        return self.words


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ran:
    """How the cell's pytest ended, as far as its engine can tell."""

    exit_code: int | None  # pytest's (host 0's); None where nothing says
    timed_out: bool = False  # pytest ran past the cell's timeout and was stopped (the local engine)
    cause: EngineCause | None = None  # why the engine ended the cell in error (a host lost, scancel, its timeout)
    memory: MemoryReport | None = None  # what the cell's hosts sampled; None: nothing (this machine's monitor, if any)


def host_lost(folder: Path) -> EngineCause | None:
    """What host 0's hub wrote when a host went silent or its agent's connection closed (untrusted: bounded)."""
    lost = folder / HOST_LOST_JSON
    if not lost.is_file():
        return None
    try:
        data = json.loads(lost.read_text()[:4096])
        words = f"host {int(data['host'])} ({str(data['hostname'])[:64]}) lost: {str(data['reason'])[:200]}"
    except (ValueError, KeyError, TypeError, OSError):
        words = f"a host was lost ({HOST_LOST_JSON} unreadable)"
    return EngineCause(contract.ERROR_HOST_LOST, words)


class JobFields(TypedDict):
    """env.json's job fields, filled by the engine as it learns them (read even when it raises)."""

    job_id: str | None  # the engine's job: a Slurm job id, a JobSet's name
    hosts: list[str]  # every host of the cell, host 0 first
    cleanup: CleanupRecord | None  # how an engine that runs here ended the cell's processes


class Engine(Protocol):
    """What starts, watches and ends a cell's pytest on the cell's hosts."""

    name: str  # runners.yaml's `engine:`
    # The cell's ranks run on this machine: harness matches the cell to this machine's GPUs, refuses busy
    # ones, and samples them while it runs. Otherwise the engine's hosts do that for themselves.
    runs_here: bool

    def settings(self, options: SubmitOptions | None) -> object:
        """This engine's own settings type, read from runners.yaml's `submit:`; a `ConfigError` naming the
        file and key when one is unknown or wrong. The run's plan stage asks before any cell starts."""
        ...

    def run(self, launch: Launch, job: JobFields) -> Ran:
        """Runs the cell's pytest to its end (or its timeout); raises `Interrupted` after stopping it."""
        ...


def pytest_command(cell: Cell, python: Path, folder: Path, pytest_args: list[str] | tuple[str, ...],
                   pack_tests: bool = False, durations: Path | None = None) -> list[str]:
    # -p: the ranks plugin's options must exist when pytest parses them, where harness is not installed in
    # the cell's environment (installed, its pytest11 entry point has the same name and is not loaded twice).
    # A test's captured output, its ranks' included, goes to its testcase in junit.xml (junit_logging) and is
    # shown with a failure; -r lists failures, errors and unexpected passes, not one line per passed test (a green
    # suite is hundreds of them: the summary counts them) nor their output (the P that -rA adds), nor the skips
    # and expected failures: harness's closing summary groups those by reason and by known-bugs entry.
    command = [str(python), "-m", "pytest", *cell.suite, *(("-m", cell.markers) if cell.markers else ()), "-p", PLUGIN,
               "-p", "no:cacheprovider", "-o", "junit_family=xunit1", "-o", "junit_logging=all",
               f"--junitxml={folder / JUNIT_XML}", f"--ranks-log={folder / RANKS_LOG}",
               f"--timeout={cell.test_timeout_seconds}", "-rfEX"]
    if cell.reruns:
        command.append(f"--reruns={cell.reruns}")
    if pack_tests and cell.hosts == 1:  # several tests at once where they fit (harness.ranks.packing)
        command.append("--pack-tests")
        if durations is not None:  # the longest first, by the last kept run's seconds (harness.results.durations)
            command.append(f"--pack-durations={durations}")
    return command + list(pytest_args)


def pytest_environment(cell: Cell, gpus: list | tuple, import_path: Path | None = None) -> dict[str, str]:
    environ = dict(os.environ)
    if import_path is not None:
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(import_path), environ.get("PYTHONPATH")]))
    # No bytecode written: a cached environment stays as built, so its manifest check passes next time.
    environ.update({CELL_ID_ENV: cell.id, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    if cell.is_cpu:
        environ[CPU_RANKS_ENV] = str(cell.gpus)
        environ["CUDA_VISIBLE_DEVICES"] = ""  # a cpu cell means gloo, even on a GPU machine
    else:
        # UUIDs name exactly the GPUs the monitor watches, whatever order CUDA enumerates in.
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu.uuid for gpu in gpus)
        environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return environ
