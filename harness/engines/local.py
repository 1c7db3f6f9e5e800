"""The local engine: the cell's pytest as a child of `harness run`, on this machine's GPUs (or CPU ranks).

pytest's output streams as it comes to pytest.log and the terminal. After the cell's timeout pytest gets
SIGINT (it still writes junit.xml), then SIGKILL; when harness itself is interrupted, the same with a short
grace. Every process of the cell carries a token in its environment and writes temporary files under a
folder of its own; on every way out, whatever still carries the token is killed and the folder removed.
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
import uuid
from collections.abc import Callable
from pathlib import Path

from harness.contract import PYTEST_LOG, RUNNING_TEST, RUNNING_TEST_ENV
from harness.engines.base import Interrupted, JobFields, Launch, Ran, pytest_command, pytest_environment
from harness.errors import ConfigError
from harness.plan.cells import Cell, SubmitOptions
from harness.ranks import lifecycle
from harness.ranks.lifecycle import CELL_TOKEN_ENV, kill_cell_processes

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
        exit_code, timed_out = run_pytest(launch.cell, launch.python, launch.folder, list(launch.gpus),
                                          list(launch.pytest_args), launch.log, project=launch.project,
                                          import_path=launch.import_path)
        return Ran(exit_code=exit_code, timed_out=timed_out)


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
