"""The local engine: the cell's pytest as a child of `harness run`, on this machine's GPUs (or CPU ranks).

pytest's output streams as it comes to pytest.log and the terminal. After the cell's timeout pytest gets
SIGINT (it still writes junit.xml), then SIGKILL; when harness itself is interrupted, the same with a short
grace. pytest starts in the cell's containment (its own cgroup, else under harness as child subreaper, and a
token in its environment: harness.containment.containment) and writes temporary files under a folder of its own;
on every way out every process of the cell is killed, the folder removed, and what ended them recorded
(env.json's "cleanup", through the job fields).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from harness.containment import cgroup
from harness.containment.containment import Containment, describe
from harness.containment.tether import tethered
from harness.contract import PYTEST_LOG, RUNNING_TEST, CleanupRecord
from harness.engines.base import Interrupted, JobFields, Launch, Ran, pytest_command, pytest_environment
from harness.environment import RUNNING_TEST_FILE_ENV
from harness.errors import ConfigError
from harness.plan.cells import Cell, SubmitOptions
from harness.ranks.output import PrintableStream
from harness.results.durations import earlier_durations, write_durations

# After the cell's timeout pytest gets SIGINT (it still writes junit.xml), then this long before SIGKILL.
INTERRUPT_GRACE_SECONDS = 20
# When harness itself is interrupted (SIGTERM, Ctrl-C) pytest gets SIGINT and this long before SIGKILL.
STOP_GRACE_SECONDS = 3


class LocalEngine:
    """One host, this one: pytest runs here on the cell's GPUs of this machine."""

    name = "local"
    runs_here = True

    def settings(self, options: SubmitOptions | None) -> None:
        if options is not None:  # nothing to submit to: a `submit:` here is a runner meant for another engine
            raise ConfigError(f"{options.where}: the local engine takes no submit: settings "
                              "(set the runner's engine: slurm or jobset)")

    def run(self, launch: Launch, job: JobFields) -> Ran:
        def cleaned_up(record: CleanupRecord) -> None:
            job["cleanup"] = record
            if record.killed or record.survivors or record.fallback:
                launch.log(f"   {describe(record)}")

        exit_code, timed_out = run_pytest(launch.cell, launch.python, launch.folder, list(launch.gpus),
                                          list(launch.pytest_args), launch.log, project=launch.project,
                                          import_path=launch.import_path, cleaned_up=cleaned_up,
                                          pack_tests=launch.pack_tests)
        return Ran(exit_code=exit_code, timed_out=timed_out)


def run_pytest(cell: Cell, python: Path, folder: Path, gpus: list, pytest_args: list[str],
               log: Callable[[str], None], *, project: Path, import_path: Path | None = None,
               echo: Callable[[bytes], None] | None = None,
               cleaned_up: Callable[[CleanupRecord], None] | None = None,
               pack_tests: bool = False) -> tuple[int | None, bool]:
    """Runs the suite from the project root, streaming its output as it comes to pytest.log and the
    terminal. Returns (exit code, timed out); `cleaned_up` gets how the cell's processes were ended.

    pytest starts in the cell's containment and writes temporary files under a folder of its own; on every
    way out every process of the cell is killed and the folder removed."""
    temporary = tempfile.mkdtemp(prefix="harness-cell-")
    durations = _earlier_durations(cell, folder, Path(temporary)) if pack_tests else None
    command = pytest_command(cell, python, folder, pytest_args, pack_tests, durations)
    log("   " + shlex.join(command))
    containment = Containment(use_cgroup=cgroup.wanted(os.environ))
    environ = {**pytest_environment(cell, gpus, import_path), **containment.environ, "TMPDIR": temporary,
               RUNNING_TEST_FILE_ENV: str(folder / RUNNING_TEST)}
    try:
        with (folder / PYTEST_LOG).open("wb") as pytest_log:
            with containment.born_inside():
                # Its own group: a timeout kills every rank. Tethered: if this run is SIGKILLed, pytest dies too
                # (and its zygote and ranks with it), rather than run on with nobody to end it.
                process = subprocess.Popen(containment.confined(tethered(command, signal.SIGKILL)), cwd=project,
                                           env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           start_new_session=True)
            containment.spare(process.pid)  # its exit status is Popen's to read
            reader = threading.Thread(target=stream_output,
                                      args=(process.stdout, pytest_log, echo or echo_terminal), daemon=True)
            reader.start()
            timed_out = False
            try:
                containment.wait(process, timeout=cell.timeout_minutes * 60)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop_group(process)
            except Interrupted:
                _stop_group(process, interrupt_grace=STOP_GRACE_SECONDS)
                raise
            finally:
                _end_pytest(process)
                containment.end()  # before the reader's join: a process left behind may hold pytest's output open
                reader.join(timeout=10)
    finally:
        record = containment.end()  # the one above, or (pytest never started) now
        if cleaned_up is not None:
            cleaned_up(record)
        shutil.rmtree(temporary, ignore_errors=True)
    return process.returncode, timed_out


def _earlier_durations(cell: Cell, folder: Path, temporary: Path) -> Path | None:
    """The cell's tests' seconds in the newest run the results folder kept, as a file for `--pack-durations`."""
    durations = earlier_durations(folder.parent, cell.id)
    try:
        return write_durations(durations, temporary / "durations.json") if durations else None
    except OSError:  # the tests then run by world size, as with no earlier run
        return None


def stream_output(source, log_file, echo: Callable[[bytes], None]) -> None:
    """Copies pytest's output as it arrives, not a line at a time: its progress dots for one test file
    are one line, which on a long GPU cell would leave the terminal silent for minutes. pytest.log gets the
    bytes as they are; `echo` gets them printable (the tested code's escape sequences shown, not played)."""
    terminal_open = True
    shown = PrintableStream()
    while chunk := os.read(source.fileno(), 65536):
        log_file.write(chunk)
        log_file.flush()
        if terminal_open:
            try:
                echo(shown(chunk))
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


def _end_pytest(process: subprocess.Popen) -> None:
    """pytest and its group (ranks lead groups of their own: the containment finds those), then its exit status
    read before the containment reaps what is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
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
