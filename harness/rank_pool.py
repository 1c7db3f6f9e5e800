"""A persistent rank pool for the `ranks` fixture: one set of rank processes per (world size, device), started
on first use and kept for the pytest session, so a test pays for its own work and not for starting
processes, importing torch and transformers and forming a process group.

Load it with `-p harness.rank_pool` (or from the suite's conftest). On configure it puts a launcher into
`config.stash[harness.pytest_plugin.LAUNCHER_KEY]` with the contract of
`harness.distributed.run_distributed(world_size, fn, *args, timeout=..., device=...)`: one `RankResult` per
rank (the value, and the allocator peaks of this call), or `RankFailedError` / `RankTimeoutError` with the
same messages. Tests do not change.

- Each call sends the pickled `(fn, args)`, the parent's `sys.path` and environment to every rank. Between
  calls a rank puts back what a test may leave behind: the suite modules' globals, default dtype, RNG
  states, grad mode, thread count, working directory, warnings filters, process groups the call created;
  then it collects garbage and empties the CUDA cache. Peaks are reset before each call.
- After any failure or exception on any rank, or a hang (killed at the timeout with every rank's Python
  stack), the pool is killed and the next call starts a fresh one, so a rerun gets a healthy pool.
- Ranks are forked from a *zygote*: a process spawned once per session (as collection ends, when a test
  uses `ranks`) that imports torch, the modules of the functions called and the modules the ranks went on
  to import, and never touches CUDA; so a fresh pool costs a fork and a process-group init, not new
  interpreters and imports. Imports that start a thread or initialize the CUDA driver would make forking
  unsafe: the zygote then refuses, and is restarted importing less (the functions' modules, then torch alone). If
  even that is refused, or the first forked pool cannot start where a spawned one can, ranks are spawned
  for the rest of the session; the terminal summary says why.
- No rank outlives the session: pools are killed at unconfigure, and the zygote and every rank exit when
  pytest dies. A forked rank watches pytest, not the zygote, so a zygote that exits (it does when a
  preload makes forking unsafe) leaves the running pools alone.

Off with `--no-ranks-pool`, the ini `ranks_pool = false`, or `HARNESS_RANKS_POOL=0` (then every call spawns
its ranks); `HARNESS_RANKS_POOL=spawn` keeps the pool but spawns its ranks instead of forking them.
`HARNESS_RANKS_TIMING=PATH` appends one JSON line per call: how long `fn` ran on each rank and the call's
wall time in the parent (tests/benchmarks/bench_pool.py reads it).

Needs the standard library and pytest here, torch in the ranks, so a cell's environment can load it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import faulthandler
import gc
import importlib
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from harness import distributed
from harness.distributed import DEFAULT_TIMEOUT_S, MIB, RankFailedError, RankResult, RankTimeoutError
from harness.pytest_plugin import LAUNCHER_KEY

POOL_ENV = "HARNESS_RANKS_POOL"
TIMING_ENV = "HARNESS_RANKS_TIMING"
POOL_HELP = ("keep one pool of rank processes per world size for the session instead of spawning ranks for "
             f"every test (default on; {POOL_ENV}=0 turns it off, {POOL_ENV}=spawn spawns the pool's ranks)")
POOL_MODES = {"0": None, "1": "fork", "spawn": "spawn"}
# After the first failure the other ranks get this long to report before the pool is killed: gloo peers of a
# rank that exited fail within milliseconds, NCCL peers wait in their collective until killed, and the pool
# is rebuilt either way.
PEER_FAILURE_GRACE_S = 2.0
# How long a dead forked rank's exit status may take to come from the zygote that reaps it.
EXIT_STATUS_WAIT_S = 1.0
POLL_S = 0.1

POOL_KEY = pytest.StashKey["PoolLauncher"]()


# ---------------------------------------------------------------- plugin hooks, in lifecycle order


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness")
    group.addoption("--ranks-pool", action="store_true", default=None, dest="ranks_pool", help=POOL_HELP)
    group.addoption("--no-ranks-pool", action="store_false", dest="ranks_pool",
                    help=f"spawn fresh ranks for every test (as {POOL_ENV}=0)")
    parser.addini("ranks_pool", type="bool", default=True, help=POOL_HELP)


def pytest_configure(config: pytest.Config) -> None:
    mode = pool_mode(config)
    if mode is None:
        return
    launcher = PoolLauncher(fork=mode == "fork")
    config.stash[POOL_KEY] = launcher
    config.stash[LAUNCHER_KEY] = launcher


def pytest_collection_finish(session: pytest.Session) -> None:
    # The zygote imports torch while pytest sets up the first test's fixtures.
    launcher = session.config.stash.get(POOL_KEY, None)
    if launcher is not None and not session.config.option.collectonly and \
            any("ranks" in getattr(item, "fixturenames", ()) for item in session.items):
        launcher.warm_up()


def pytest_report_header(config: pytest.Config) -> str:
    launcher = config.stash.get(POOL_KEY, None)
    if launcher is None:
        return "rank pool: off (ranks spawned for every call)"
    return f"rank pool: on ({'forked from a zygote' if launcher.fork else 'spawned'} ranks)"


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    launcher = config.stash.get(POOL_KEY, None)
    if launcher is not None and launcher.calls:
        terminalreporter.write_line(f"rank pool: {launcher.summary()}")


def pytest_unconfigure(config: pytest.Config) -> None:
    launcher = config.stash.get(POOL_KEY, None)
    if launcher is not None:
        launcher.close()


def pool_mode(config: pytest.Config) -> str | None:
    """"fork", "spawn", or None (off): the command line, then HARNESS_RANKS_POOL, then the ini."""
    option = config.getoption("ranks_pool", default=None)
    value = os.environ.get(POOL_ENV, "").strip().lower()
    if value not in ("", *POOL_MODES):
        raise pytest.UsageError(f"{POOL_ENV} must be one of {', '.join(POOL_MODES)}, got {value!r}")
    if option is not None:
        on = option
    elif value:
        return POOL_MODES[value]
    else:
        on = config.getini("ranks_pool")
    if not on:
        return None
    return "spawn" if value == "spawn" else "fork"


# ---------------------------------------------------------------- the launcher (parent side)


class PoolLauncher:
    """`run_distributed` on persistent pools: `launcher(world_size, fn, *args, timeout=..., device=...)`."""

    def __init__(self, *, fork: bool = True):
        self.fork = fork
        self.preload_refused: str | None = None  # why the zygote imports less than it could
        self.fork_refused: str | None = None  # why ranks are spawned: the zygote could not fork even bare
        self._fork_proven = False  # a forked pool has formed its process group this session
        self.calls = 0
        self.pools_started = 0
        self.pools_killed = 0
        self._pools: dict[tuple[int, str], _Pool] = {}
        self._zygote: _Zygote | None = None
        # What the zygote imports besides torch: the modules of the functions called, and (from level 2) the
        # modules the ranks imported while they ran (transformers loads most of itself lazily), so a fresh
        # pool imports nothing again. A level that makes forking unsafe is given up for the one below.
        self._preload_level = 2
        self._fn_modules: list[str] = []
        self._rank_modules: dict[str, None] = {}
        atexit.register(self.close)

    def __call__(self, world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = DEFAULT_TIMEOUT_S,
                 device: str = "auto") -> list[RankResult]:
        payload = distributed.pickle_call(world_size, fn, args, device, caller="the rank pool")
        self.calls += 1
        module = getattr(fn, "__module__", None)
        if module and module != "__main__" and module not in self._fn_modules:
            self._fn_modules.append(module)

        started = time.monotonic()
        deadline = started + timeout
        key = (world_size, device)
        pool_start_s = 0.0
        outcome, work = "failed", []
        try:
            pool = self._pools.get(key)
            if pool is not None and not pool.reusable(timeout):
                self._discard(key)
                pool = None
            if pool is None:
                pool = self._start_pool(world_size, device, timeout, deadline)
                pool_start_s = time.monotonic() - started
            replies = pool.run(payload, deadline, timeout)
            work = [reply["seconds"] for reply in replies]
            outcome = "passed"
            self._preload(replies[0]["modules"])
            return [RankResult(rank=rank, value=reply["value"], peak_allocated_mib=reply["peak_allocated_mib"],
                               peak_reserved_mib=reply["peak_reserved_mib"]) for rank, reply in enumerate(replies)]
        except BaseException as error:  # a failure, a hang, or pytest-timeout / Ctrl-C while we waited
            if isinstance(error, RankTimeoutError):
                outcome = "timeout"
            work = getattr(error, "rank_seconds", work)
            self._discard(key)
            self._preload(getattr(error, "rank_modules", []))
            raise
        finally:
            _record_timing(world_size, device, fn, outcome, work, time.monotonic() - started, pool_start_s)

    def summary(self) -> str:
        if not self.fork:
            how = "spawned"
        elif self.fork_refused:
            how = f"spawned ({self.fork_refused})"
        else:
            how = "forked from a zygote"
            if self.preload_refused:
                imports = "the functions' modules" if self._preload_level == 1 else "torch alone"
                how += f" importing {imports} ({self.preload_refused})"
        return (f"{self.calls} calls, {self.pools_started} pools started, {self.pools_killed} killed after a "
                f"failure or hang; ranks {how}")

    def warm_up(self) -> None:
        """Start the zygote now (it imports torch in the background) rather than at the first call."""
        if self.fork and not self.fork_refused and self._zygote is None:
            self._start_zygote()

    def close(self) -> None:
        """Kill every pool and the zygote; safe to call more than once."""
        for key in list(self._pools):
            self._pools.pop(key).kill()
        if self._zygote is not None:
            self._zygote.kill()
            self._zygote = None

    def _discard(self, key: tuple[int, str]) -> None:
        pool = self._pools.pop(key, None)
        if pool is not None:
            pool.kill()
            self.pools_killed += 1

    def _start_pool(self, world_size: int, device: str, timeout: float, deadline: float) -> _Pool:
        pool = self._new_pool(world_size, device, timeout)
        if self._fork_ranks(pool, deadline, timeout):
            try:
                pool.wait_ready(deadline)
                self._fork_proven = True
                return pool
            except RankFailedError as forked_error:
                if self._fork_proven:
                    raise
                # Forked ranks never formed a pool here: spawned ones settle whether forking is to blame.
                self._discard((world_size, device))
                pool = self._new_pool(world_size, device, timeout)
                pool.spawn_ranks()
                pool.wait_ready(deadline)
                self.fork_refused = f"forked ranks could not start: rank {forked_error.rank} {forked_error.summary}"
                self._stop_zygote()
                return pool
        pool.spawn_ranks()
        pool.wait_ready(deadline)
        return pool

    def _new_pool(self, world_size: int, device: str, timeout: float) -> _Pool:
        pool = _Pool(world_size, device, collective_timeout_s=timeout)
        self._pools[(world_size, device)] = pool
        self.pools_started += 1
        return pool

    def _fork_ranks(self, pool: _Pool, deadline: float, timeout: float) -> bool:
        """Fork the pool's ranks from the zygote; False when they must be spawned instead."""
        while self.fork and not self.fork_refused:
            if self._zygote is None or not self._zygote.alive():
                self._start_zygote()
            try:
                pool.fork_ranks(self._zygote, self._fn_modules if self._preload_level >= 1 else [], deadline,
                                timeout)
                return True
            except _ForkRefused as refused:
                self._stop_zygote()
                if self._preload_level > 0 and not refused.bare:
                    self._preload_level -= 1
                    self.preload_refused = str(refused)
                else:
                    self.fork_refused = str(refused)
            except BaseException:  # still importing at the deadline
                self._stop_zygote()
                raise
        return False

    def _start_zygote(self) -> None:
        self._stop_zygote()
        self._zygote = _Zygote()
        if self._preload_level >= 2 and self._rank_modules:
            self._zygote.preload(list(self._rank_modules))

    def _stop_zygote(self) -> None:
        if self._zygote is not None:
            self._zygote.kill()
            self._zygote = None

    def _preload(self, modules: list[str]) -> None:
        """Have the zygote import what the ranks imported, while the tests go on."""
        new = [module for module in modules if module not in self._rank_modules]
        self._rank_modules.update(dict.fromkeys(new))
        if new and self._preload_level >= 2 and self._zygote is not None:
            self._zygote.preload(new)


def _record_timing(world_size: int, device: str, fn: Callable[..., Any], outcome: str, work: list,
                   call_s: float, pool_start_s: float) -> None:
    """One JSON line per call to HARNESS_RANKS_TIMING: fn's seconds on each rank, the call's wall time."""
    path = os.environ.get(TIMING_ENV)
    if not path:
        return
    known = [seconds for seconds in work if seconds is not None]
    record = {"test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0], "world_size": world_size,
              "device": device, "fn": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}",
              "outcome": outcome, "work_s": max(known) if known else None, "rank_work_s": work,
              "call_s": round(call_s, 6), "pool_start_s": round(pool_start_s, 6)}
    with open(path, "a") as timing:
        timing.write(json.dumps(record) + "\n")


@dataclasses.dataclass
class _RankHandle:
    """The parent's view of one rank; `pid` is what `distributed.signal_process` needs."""

    rank: int
    pid: int | None = None
    process: multiprocessing.Process | None = None  # spawned ranks; forked ones belong to the zygote
    connection: multiprocessing.connection.Connection | None = None


class _ForkRefused(Exception):
    """The zygote's imports made forking unsafe (a thread, or an initialized CUDA driver). `bare`: importing
    torch alone did, so no zygote can fork."""

    def __init__(self, reason: str, bare: bool = False):
        super().__init__(reason)
        self.bare = bare


class _Pool:
    """The ranks of one (world size, device), their sockets and stack files."""

    def __init__(self, world_size: int, device: str, collective_timeout_s: float):
        self.world_size = world_size
        self.device = device
        self.collective_timeout_s = collective_timeout_s
        self.workdir = Path(tempfile.mkdtemp(prefix="harness-pool-"))
        self.ranks = [_RankHandle(rank) for rank in range(world_size)]
        self._zygote: _Zygote | None = None
        self._address = str(self.workdir / "parent.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self._address)
        self._server.listen(world_size)
        self._launch = distributed.Launch(world_size=world_size, port=distributed.free_port(),
                                          workdir=str(self.workdir), timeout_s=collective_timeout_s,
                                          device=device, parent_pid=os.getpid())

    def _specs(self) -> list[_RankSpec]:
        return [_RankSpec(self._launch, rank, self._address, dict(os.environ)) for rank in range(self.world_size)]

    def fork_ranks(self, zygote: _Zygote, modules: list[str], deadline: float, timeout_s: float) -> None:
        self._zygote = zygote
        for handle, pid in zip(self.ranks, zygote.fork(self._specs(), modules, deadline, timeout_s), strict=True):
            handle.pid = pid

    def spawn_ranks(self) -> None:
        context = multiprocessing.get_context("spawn")
        for handle, spec in zip(self.ranks, self._specs(), strict=True):
            handle.process = context.Process(target=_serve_rank, args=(spec,), name=f"harness-pool-rank{spec.rank}")
            handle.process.start()
            handle.pid = handle.process.pid

    def wait_ready(self, deadline: float) -> None:
        """Until every rank has connected and formed the process group."""
        self._server.settimeout(POLL_S)
        waiting = {handle.rank for handle in self.ranks}
        while waiting:
            with contextlib.suppress(TimeoutError, socket.timeout):
                sock, _ = self._server.accept()
                sock.setblocking(True)
                connection = multiprocessing.connection.Connection(sock.detach())
                rank = connection.recv()
                self.ranks[rank].connection = connection
                waiting.discard(rank)
                continue
            dead = {rank: None for rank in sorted(waiting) if self._exit_code(self.ranks[rank], wait_s=0) is not None}
            if dead:
                self._raise_failures(dead, {})
            if time.monotonic() > deadline:
                raise self._timeout_error(sorted(waiting), self.collective_timeout_s)
        self._server.close()
        self._gather(deadline, self.collective_timeout_s)

    def reusable(self, timeout: float) -> bool:
        """Every rank alive and idle, with collectives allowed to last as long as this call may."""
        if timeout > self.collective_timeout_s:
            return False
        # Ranks send nothing between calls: a readable connection is a closed one.
        return all(handle.connection is not None and not handle.connection.poll() for handle in self.ranks)

    def run(self, payload: bytes, deadline: float, timeout_s: float) -> list[dict[str, Any]]:
        message = pickle.dumps(("call", payload, list(sys.path), dict(os.environ)))
        for handle in self.ranks:
            distributed.stack_path(self.workdir, handle.rank).write_text("")  # this call's stacks only
        for handle in self.ranks:
            with contextlib.suppress(OSError):  # a dead rank shows as a closed connection when gathered
                handle.connection.send_bytes(message)
        return self._gather(deadline, timeout_s)

    def _gather(self, deadline: float, timeout_s: float) -> list[dict[str, Any]]:
        """One reply from every rank; raises as run_distributed does when a rank fails or hangs."""
        replies: dict[int, dict[str, Any]] = {}
        failures: dict[int, dict[str, Any] | None] = {}  # None: died without a word
        failure_seen_at: float | None = None
        while len(replies) + len(failures) < self.world_size:
            pending = {handle.connection: handle for handle in self.ranks
                       if handle.rank not in replies and handle.rank not in failures}
            now = time.monotonic()
            if failure_seen_at is not None and now - failure_seen_at > PEER_FAILURE_GRACE_S:
                break
            if now > deadline and not failures:
                raise self._timeout_error(sorted(handle.rank for handle in pending.values()), timeout_s, replies)
            if now > deadline:
                break
            for connection in multiprocessing.connection.wait(list(pending), timeout=POLL_S):
                handle = pending[connection]
                try:
                    kind, content = pickle.loads(connection.recv_bytes())
                except (EOFError, OSError):
                    kind, content = "died", None
                except Exception as error:  # a value this process cannot unpickle
                    kind, content = "error", _failure(error)
                if kind == "ok":
                    replies[handle.rank] = content
                else:
                    failures[handle.rank] = content
                    failure_seen_at = failure_seen_at or time.monotonic()
        if failures:
            self._raise_failures(failures, replies)
        return [replies[rank] for rank in range(self.world_size)]

    def _raise_failures(self, failures: dict[int, dict[str, Any] | None], replies: dict[int, Any]) -> None:
        # A rank that died without a word goes first: its peers' errors (a connection reset) follow from it,
        # and the parent notices a death only after they report. Otherwise the earliest error goes first.
        found = []
        for rank, failure in failures.items():
            if failure is not None:
                found.append(((1, failure["failed_at"]), rank, f"raised {failure['error_type']}: "
                              f"{failure['error_message']}", failure["traceback"]))
                continue
            stack = distributed.read_stack(self.workdir, rank)
            details = f"last Python stack of rank {rank}:\n{stack}" if stack else "no Python stack was written"
            exit_code = self._exit_code(self.ranks[rank], wait_s=EXIT_STATUS_WAIT_S)
            found.append(((0, rank), rank, f"exited {distributed.describe_exit(exit_code)} without a result",
                          details))
        found.sort(key=lambda failure: failure[0])
        _, rank, summary, details = found[0]
        others = [f"rank {other} {other_summary}" for _, other, other_summary, _ in found[1:]]
        others += [f"rank {handle.rank} was still running and was killed" for handle in self.ranks
                   if handle.rank not in failures and handle.rank not in replies]
        error = RankFailedError(rank, summary, details, others)
        outcomes = [replies.get(each) or failures.get(each) or {} for each in range(self.world_size)]
        error.rank_seconds = [outcome.get("seconds") for outcome in outcomes]
        error.rank_modules = [name for outcome in outcomes for name in outcome.get("modules", ())]
        raise error

    def _timeout_error(self, hung: list[int], timeout_s: float, replies: dict[int, Any] | None = None) \
            -> RankTimeoutError:
        for rank in hung:
            if self.ranks[rank].pid is not None:
                distributed.signal_process(self.ranks[rank], signal.SIGUSR1)
        distributed.wait_for_stacks(self.workdir, hung)
        stacks = {rank: distributed.read_stack(self.workdir, rank) or
                  "(no stack written: the rank did not answer SIGUSR1)" for rank in hung}
        stacks.update({rank: "(finished: returned its result)" for rank in range(self.world_size) if rank not in hung})
        error = RankTimeoutError(timeout_s, hung, stacks)
        error.rank_seconds = [(replies or {}).get(rank, {}).get("seconds") for rank in range(self.world_size)]
        return error

    def _exit_code(self, handle: _RankHandle, wait_s: float) -> int | None:
        if handle.process is not None:
            handle.process.join(wait_s)
            return handle.process.exitcode
        if handle.pid is not None and self._zygote is not None:
            return self._zygote.exit_code(handle.pid, wait_s)
        return None

    def kill(self) -> None:
        for handle in self.ranks:
            if handle.pid is not None:
                distributed.signal_process(handle, signal.SIGKILL)
        for handle in self.ranks:
            if handle.connection is not None:
                handle.connection.close()
            if handle.process is not None:
                handle.process.join(10)
                handle.process.close()
        self._server.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


class _Zygote:
    """The parent's handle on the process that forks ranks (see `_zygote_main`)."""

    def __init__(self):
        context = multiprocessing.get_context("spawn")
        self._connection, child_end = context.Pipe()
        self._process = context.Process(target=_zygote_main, args=(child_end, os.getpid()), daemon=True,
                                        name="harness-rank-zygote")
        self._process.start()
        child_end.close()
        self._exit_codes: dict[int, int] = {}

    def alive(self) -> bool:
        return self._process.is_alive()

    def preload(self, modules: list[str]) -> None:
        """Import `modules` before the next fork (the zygote refuses to fork if that made forking unsafe)."""
        with contextlib.suppress(OSError):  # gone: the next fork finds out
            self._connection.send(("preload", modules, list(sys.path)))

    def fork(self, specs: list[_RankSpec], modules: list[str], deadline: float, timeout_s: float) -> list[int]:
        """Import `modules` in the zygote, then fork one rank per spec; their pids."""
        try:
            self._connection.send(("preload", modules, list(sys.path)))
            self._connection.send(("fork", specs))
        except OSError:
            raise _ForkRefused(f"the zygote exited {distributed.describe_exit(self._process.exitcode)}") from None
        while time.monotonic() < deadline:
            message = self._receive(timeout=POLL_S)
            if message is None:
                continue
            if message[0] == "forked":
                return message[1]
            if message[0] == "refused":
                raise _ForkRefused(message[1], bare=message[2])
        raise RankTimeoutError(timeout_s, list(range(len(specs))),
                               {spec.rank: "(not started: the zygote was still importing)" for spec in specs})

    def exit_code(self, pid: int, wait_s: float) -> int | None:
        """A forked rank's exit code (negative: the signal), once the zygote has reaped it."""
        end = time.monotonic() + wait_s
        with contextlib.suppress(_ForkRefused):  # the zygote is gone too: the code is lost with it
            while pid not in self._exit_codes:
                if self._receive(timeout=max(0.0, min(POLL_S, end - time.monotonic()))) is None \
                        and time.monotonic() >= end:
                    break
        return self._exit_codes.get(pid)

    def _receive(self, timeout: float) -> tuple | None:
        """The next message other than an exit report (those are kept), or None."""
        try:
            if not self._connection.poll(timeout):
                return None
            message = self._connection.recv()
        except (EOFError, OSError):
            self._process.join(EXIT_STATUS_WAIT_S)
            raise _ForkRefused(f"the zygote exited {distributed.describe_exit(self._process.exitcode)}") from None
        if message[0] == "exited":
            self._exit_codes[message[1]] = message[2]
            return None
        return message

    def kill(self) -> None:
        distributed.signal_process(self._process, signal.SIGKILL)
        self._process.join(10)
        self._connection.close()


# ---------------------------------------------------------------- the zygote


def _zygote_main(connection: multiprocessing.connection.Connection, parent_pid: int) -> None:
    """Import torch, then serve fork requests until the parent goes; never touches CUDA."""
    os.setpgrp()  # Ctrl-C reaches pytest, which tears the pool down
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch
    import torch.distributed  # imported once here, inherited by every rank

    hazard = _fork_hazard(torch)
    if hazard is not None:
        connection.send(("refused", hazard, True))
        os._exit(0)
    while os.getppid() == parent_pid:
        _report_exits(connection)
        try:
            if not connection.poll(POLL_S):
                continue
            request = connection.recv()
        except (EOFError, OSError):
            break
        if request[0] == "preload":
            _, modules, sys_path = request
            sys.path[:] = sys_path
            for module in modules:
                with contextlib.suppress(BaseException):  # the rank imports it again and reports the error
                    importlib.import_module(module)
            hazard = _fork_hazard(torch)
            if hazard is not None:
                connection.send(("refused", hazard, False))
                break
        else:
            gc.collect()
            gc.freeze()  # the ranks' collections skip all that was imported here
            connection.send(("forked", [_fork_rank(spec, connection) for spec in request[1]]))
    os._exit(0)


def _fork_hazard(torch) -> str | None:
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


def _fork_rank(spec: _RankSpec, connection: multiprocessing.connection.Connection) -> int:
    sys.stdout.flush()  # or the rank writes the zygote's buffered output again
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        connection.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        random.seed()  # each rank its own stream, as a spawned one would have
        _serve_rank(spec)  # watching the launcher (pytest), not the zygote: ranks outlive a zygote that exits
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
        connection.send(("exited", pid, os.waitstatus_to_exitcode(status)))


# ---------------------------------------------------------------- rank side


@dataclasses.dataclass(frozen=True)
class _RankSpec:
    launch: distributed.Launch  # parent_pid: the launcher (pytest), whose death ends this rank
    rank: int
    address: str  # the parent's socket
    environ: dict[str, str]  # the parent's environment (a forked rank starts with the zygote's)


def _serve_rank(spec: _RankSpec) -> None:
    launch, rank = spec.launch, spec.rank
    os.setpgrp()  # the parent kills this rank and whatever it started by its process group
    _apply_environment(spec.environ)
    stack_file = open(distributed.stack_path(Path(launch.workdir), rank), "a")  # noqa: SIM115 - until exit
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    threading.Thread(target=distributed.exit_when_orphaned, args=(launch.parent_pid,),
                     name="harness-orphan-check", daemon=True).start()
    # init_rank_process_group sets the same variables again (a no-op): set here, they show in rank_environ.
    before = dict(os.environ)
    distributed.set_environment(launch, rank)
    rank_environ = {name: value for name, value in os.environ.items() if before.get(name) != value}

    connection = multiprocessing.connection.Client(spec.address, family="AF_UNIX")
    connection.send(rank)
    try:
        state = _RankState(launch, rank)
    except BaseException as error:
        _reply_failure(connection, error, seconds=None)
    _reply(connection, ("ok", {"seconds": None}))
    while True:
        try:
            _, payload, sys_path, environ = pickle.loads(connection.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)
        sys.path[:] = sys_path
        _apply_environment({**environ, **rank_environ})
        started = time.perf_counter()
        try:
            outcome = state.call(payload)
            data = pickle.dumps(("ok", outcome))  # a result that does not pickle is this rank's failure
        except BaseException as error:
            _reply_failure(connection, error, seconds=time.perf_counter() - started, modules=state.imported())
        connection.send_bytes(data)
        state.reset()  # after replying: the parent moves on while this rank cleans up


def _reply(connection: multiprocessing.connection.Connection, message: tuple) -> None:
    connection.send_bytes(pickle.dumps(message))


def _failure(error: BaseException, seconds: float | None = None, modules: list[str] | None = None) -> dict[str, Any]:
    return {"failed_at": time.time(), "error_type": type(error).__qualname__,
            "error_message": distributed.first_line(error), "traceback": traceback.format_exc(),
            "seconds": seconds, "modules": modules or []}


def _reply_failure(connection: multiprocessing.connection.Connection, error: BaseException,
                   seconds: float | None, modules: list[str] | None = None) -> None:
    """Report, then exit at once: peers blocked in a collective with this rank notice it is gone, and
    interpreter teardown could wait on such a collective."""
    with contextlib.suppress(OSError):
        _reply(connection, ("error", _failure(error, seconds, modules)))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _apply_environment(environ: dict[str, str]) -> None:
    """Make os.environ equal `environ`, touching only what differs (other threads may read it)."""
    for name in [name for name in os.environ if name not in environ]:
        del os.environ[name]
    for name, value in environ.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


class _RankState:
    """A rank's process group and everything it puts back after each call."""

    def __init__(self, launch: distributed.Launch, rank: int):
        self.use_cuda = distributed.init_rank_process_group(launch, rank)
        self.cuda_device = rank  # the GPU this rank selected, when it uses CUDA
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.groups = set(self._process_groups())
        self.cwd = os.getcwd()
        self.default_dtype = torch.get_default_dtype()
        self.num_threads = torch.get_num_threads()
        self.grad_enabled = torch.is_grad_enabled()
        self.deterministic = self._deterministic_algorithms()
        self.matmul_precision = torch.get_float32_matmul_precision()
        self.rng = self._rng_state()
        self.module_globals: dict[str, dict[str, Any]] = {}
        self.modules = set(sys.modules)
        gc.freeze()  # collections between calls skip what exists now

    def call(self, payload: bytes) -> dict[str, Any]:
        torch = self.torch
        fn, args = pickle.loads(payload)
        self.module_globals = {module.__name__: dict(vars(module)) for module in _suite_modules(fn)}
        if self.use_cuda:
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        with warnings.catch_warnings():
            value = fn(*args)
        peak_allocated = peak_reserved = None
        if self.use_cuda:
            torch.cuda.synchronize()  # the call's GPU work is part of its time, and must be done
            peak_allocated = torch.cuda.max_memory_allocated() / MIB
            peak_reserved = torch.cuda.max_memory_reserved() / MIB
        seconds = time.perf_counter() - started
        return {"value": value, "seconds": seconds, "peak_allocated_mib": peak_allocated,
                "peak_reserved_mib": peak_reserved, "modules": self.imported()}

    def imported(self) -> list[str]:
        """Modules imported since the last time this was asked (the launcher has the zygote import them)."""
        imported = [name for name in sys.modules if name not in self.modules and not name.startswith("__")]
        self.modules.update(imported)
        return imported

    def reset(self) -> None:
        """Put back what a call may have changed, then free what it left."""
        torch = self.torch
        if not self.dist.is_initialized():
            raise RuntimeError("the call destroyed the default process group; this rank cannot serve another")
        for name, saved in self.module_globals.items():
            _restore_globals(sys.modules.get(name), saved)
        self.module_globals = {}
        for group in self._process_groups():
            if group not in self.groups:
                self.dist.destroy_process_group(group)
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()
        os.chdir(self.cwd)
        torch.set_default_dtype(self.default_dtype)
        torch.set_num_threads(self.num_threads)
        torch.set_grad_enabled(self.grad_enabled)
        if self._deterministic_algorithms() != self.deterministic:  # setting it imports much of torch
            torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        torch.set_float32_matmul_precision(self.matmul_precision)
        self._set_rng_state(self.rng)
        if self.use_cuda:
            torch.cuda.set_device(self.cuda_device)
        gc.collect()
        if self.use_cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def _deterministic_algorithms(self) -> tuple[bool, bool]:
        return (self.torch.are_deterministic_algorithms_enabled(),
                self.torch.is_deterministic_algorithms_warn_only_enabled())

    def _process_groups(self) -> list:
        """Every live process group, the default one included (torch keeps no public list)."""
        return list(self.dist.distributed_c10d._world.pg_map)

    def _rng_state(self) -> dict[str, Any]:
        state = {"python": random.getstate(), "torch": self.torch.get_rng_state()}
        if "numpy" in sys.modules:
            state["numpy"] = sys.modules["numpy"].random.get_state()
        if self.use_cuda:
            state["cuda"] = self.torch.cuda.get_rng_state(self.cuda_device)
        return state

    def _set_rng_state(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        self.torch.set_rng_state(state["torch"])
        if "numpy" in state:
            sys.modules["numpy"].random.set_state(state["numpy"])
        if "cuda" in state:
            self.torch.cuda.set_rng_state(state["cuda"], self.cuda_device)


def _suite_modules(fn: Callable[..., Any]) -> Iterable[Any]:
    """The loaded modules beside `fn`'s own (the test suite's code), not installed packages or the stdlib."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if not path:
        return []
    folder = os.path.dirname(os.path.abspath(path))
    installed = {os.path.abspath(p) for p in sysconfig.get_paths().values()} | {sys.prefix, sys.base_prefix}
    if any(folder == root or folder.startswith(root + os.sep) for root in installed):
        return []
    return [loaded for loaded in list(sys.modules.values())
            if isinstance(getattr(loaded, "__file__", None), str)
            and os.path.abspath(loaded.__file__).startswith(folder + os.sep)]


def _restore_globals(module: Any, saved: dict[str, Any]) -> None:
    if module is None:
        return
    namespace = vars(module)
    for name in [name for name in namespace if name not in saved]:
        del namespace[name]
    for name, value in saved.items():
        if namespace.get(name, saved) is not value:
            namespace[name] = value
