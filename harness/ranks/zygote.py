"""The zygote: a process spawned once per session that imports torch (and the modules the ranks use) and
forks ranks on request, so a fresh pool costs a fork and a process-group init, not interpreters and imports.

Which process runs what:

    launcher (pytest)  --Preload/Fork-->  zygote  --fork-->  rank (harness.ranks.rank.serve)
                       <--Forked/Refused/Exited/NotPreloaded--

Its output, and that of the ranks it forks outside their calls, goes to the rank log (harness.ranks.output).
The zygote never touches CUDA. Imports that start a thread or initialize the CUDA driver make forking unsafe:
the zygote then answers Refused (and forks no more), and the launcher starts another importing less. So does
a preload that rebinds what verdicts rest on (torch.allclose, Tensor.sum: harness.ranks.fingerprint). It
imports installed code only (harness.ranks.preload; <--NotPreloaded names what it left out): a module a test
wrote never reaches the template that later tests' ranks are forked from. The zygote reaps the ranks it forked
and reports their exit codes. It dies with the launcher, and the ranks it forked die with it (PR_SET_PDEATHSIG),
so a refused zygote is kept, idle, while its ranks serve.
Needs only the standard library here; torch in the zygote.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import os
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from harness.ranks import lifecycle
from harness.ranks.failures import RankTimeoutError, describe_exit
from harness.ranks.fingerprint import Fingerprint
from harness.ranks.installed import InstalledLocations
from harness.ranks.output import send_to_log
from harness.ranks.preload import NotPreloaded, Preloader, words
from harness.ranks.protocol import BOOTSTRAP_TIMEOUT_S, Exited, Fork, Forked, Preload, RankSpec, Refused
from harness.ranks.rank import serve

POLL_S = 0.1


class ForkRefused(Exception):
    """The zygote cannot fork (it is gone, or its imports made forking unsafe). `bare`: importing torch
    alone did, so no zygote can fork."""

    def __init__(self, reason: str, bare: bool = False):
        super().__init__(reason)
        self.bare = bare


class Zygote:
    """The launcher's handle on the zygote process."""

    def __init__(self, log: str | None = None, not_preloaded: dict[str, None] | None = None):
        """`log`: where the zygote, and the ranks it forks, write outside calls (None: where its fds point);
        `not_preloaded`: where the names it left out as no installed code are added (harness.ranks.preload)."""
        context = multiprocessing.get_context("spawn")
        self._connection, child_end = context.Pipe()
        self._process = context.Process(target=_zygote_main, args=(child_end, os.getpid(), log), daemon=True,
                                        name="harness-rank-zygote")
        self._process.start()
        child_end.close()
        self._exit_codes: dict[int, int] = {}
        self.not_preloaded = {} if not_preloaded is None else not_preloaded
        self.refused: str | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def alive(self) -> bool:
        return self.refused is None and self._process.is_alive()

    def preload(self, modules: list[str]) -> None:
        """Import `modules` before the next fork (the zygote refuses to fork if that made forking unsafe)."""
        with contextlib.suppress(OSError):  # gone: the next fork finds out
            self._connection.send(Preload(modules, list(sys.path)))

    def fork(self, specs: list[RankSpec], modules: list[str], deadline: float) -> list[int]:
        """Import `modules` in the zygote, then fork one rank per spec; their pids."""
        try:
            self._connection.send(Preload(modules, list(sys.path)))
            self._connection.send(Fork(specs))
        except OSError:
            raise ForkRefused(f"the zygote exited {describe_exit(self._process.exitcode)}") from None
        while time.monotonic() < deadline:
            message = self._receive(timeout=POLL_S)
            if isinstance(message, Forked):
                return message.pids
            if isinstance(message, Refused):
                self.refused = message.reason
                raise ForkRefused(message.reason, bare=message.bare)
        raise RankTimeoutError(BOOTSTRAP_TIMEOUT_S, [spec.rank for spec in specs],
                               {spec.rank: "(not started: the zygote was still importing)" for spec in specs})

    def exit_code(self, pid: int, wait_s: float) -> int | None:
        """A forked rank's exit code (negative: the signal), once the zygote has reaped it."""
        end = time.monotonic() + wait_s
        with contextlib.suppress(ForkRefused):  # the zygote is gone too: the code is lost with it
            while pid not in self._exit_codes:
                if self._receive(timeout=max(0.0, min(POLL_S, end - time.monotonic()))) is None \
                        and time.monotonic() >= end:
                    break
        return self._exit_codes.get(pid)

    def exits(self) -> dict[int, int]:
        """Every exit the zygote reported so far (pid -> code), reading what has arrived."""
        with contextlib.suppress(ForkRefused):
            while self._connection.poll(0):
                message = self._receive(timeout=0)
                if message is not None:
                    break  # not an exit report: nothing else is expected between requests
        return dict(self._exit_codes)

    def _receive(self, timeout: float) -> object | None:
        """The next message other than an exit report or the names of modules left out (those are kept), or None."""
        try:
            if not self._connection.poll(timeout):
                return None
            message = self._connection.recv()
        except (EOFError, OSError):
            self._process.join(1.0)
            raise ForkRefused(f"the zygote exited {describe_exit(self._process.exitcode)}") from None
        if isinstance(message, Exited):
            self._exit_codes[message.pid] = message.exit_code
            return None
        if isinstance(message, NotPreloaded):
            self.not_preloaded.update(dict.fromkeys(message.modules))
            return None
        return message

    def kill(self) -> None:
        if self._process.pid is not None:
            lifecycle.signal_group(self._process.pid, signal.SIGKILL)
        self._process.join(10)
        self._connection.close()


# ---------------------------------------------------------------- the zygote process


def _zygote_main(connection: multiprocessing.connection.Connection, launcher_pid: int, log: str | None) -> None:
    """Import torch, then serve fork requests until the launcher goes; never touches CUDA."""
    lifecycle.die_with_parent(launcher_pid)
    lifecycle.own_process_group()  # Ctrl-C reaches pytest, which tears the pools down
    send_to_log(log)  # what importing prints is no test's
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch
    import torch.distributed  # imported once here, inherited by every rank

    hazard = fork_hazard(torch)
    if hazard is not None:
        connection.send(Refused(hazard, bare=True))
        os._exit(0)
    # What the template holds before the first test: anything a preload changes of what verdicts rest on, or
    # imports from outside installed code, refuses every later fork.
    fingerprint = Fingerprint()
    preloader = Preloader(InstalledLocations.of_this_interpreter())
    refused: Refused | None = None
    while os.getppid() == launcher_pid:
        _report_exits(connection)
        try:
            if not connection.poll(POLL_S):
                continue
            request = connection.recv()
        except (EOFError, OSError):
            break
        if isinstance(request, Preload) and refused is None:
            outcome = preloader.run(request.modules, request.sys_path)
            if outcome.left_out:
                connection.send(NotPreloaded(outcome.left_out))
            hazard = outcome.unfit or template_changed(fingerprint) or fork_hazard(torch)
            if hazard is not None:
                refused = Refused(hazard, bare=False)
        elif isinstance(request, Fork):
            if refused is not None:
                connection.send(refused)  # stays, reaping the ranks it forked while they serve
                continue
            gc.collect()
            gc.freeze()  # the ranks' collections skip all that was imported here
            connection.send(Forked([_fork_rank(spec, connection) for spec in request.specs]))
    os._exit(0)


def template_changed(fingerprint: Fingerprint) -> str | None:
    """Why the template's preloads made it unfit to fork from: they rebound what verdicts rest on."""
    changed = fingerprint.changes()
    if not changed:
        return None
    return f"the zygote's preloads changed {words(changed)}, which every later test's ranks would inherit"


def fork_hazard(torch) -> str | None:
    """Why forking this process would be unsafe, or None. What breaks a forked child is an *initialized* CUDA
    driver, not a loaded one: CUDA builds of torch map libcuda at import on some hosts (seen on H200s with
    torch 2.11+cu130) and fork fine. cuInit starts the driver's own threads, named cuda-*, which is how an
    initialization by any library shows."""
    threads = [thread.name for thread in threading.enumerate() if thread is not threading.current_thread()]
    if threads:
        return f"the zygote's imports started threads {threads}"
    if torch.cuda.is_initialized():
        return "the zygote's imports initialized CUDA"
    driver_threads = [name for name in native_thread_names() if name.startswith("cuda")]
    if driver_threads:
        return f"the zygote's imports initialized the CUDA driver (its threads {driver_threads} run)"
    return None


def native_thread_names() -> list[str]:
    """The names of this process's OS threads, Python's own included; empty where /proc is missing."""
    names = []
    with contextlib.suppress(OSError):
        for task in os.scandir("/proc/self/task"):
            with contextlib.suppress(OSError):
                names.append(Path(task.path, "comm").read_text().strip())
    return names


def _fork_rank(spec: RankSpec, connection: multiprocessing.connection.Connection) -> int:
    sys.stdout.flush()  # or the rank writes the zygote's buffered output again
    sys.stderr.flush()
    zygote_pid = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        lifecycle.die_with_parent(zygote_pid)  # and the zygote dies with the launcher
        connection.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        random.seed()  # each rank its own stream, as a spawned one would have
        serve(spec)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _report_exits(connection: multiprocessing.connection.Connection) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection.send(Exited(pid, os.waitstatus_to_exitcode(status)))
