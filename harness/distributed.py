"""Run one function on N ranks, one spawned process each: NCCL with one GPU per rank when CUDA is
there, gloo on CPU otherwise.

`run_distributed(world_size, fn, *args, timeout=...)` returns one `RankResult` per rank (fn's value and
the rank's peak allocator memory), or raises:

- `RankFailedError` when a rank raised or died: its message is that rank's error and traceback;
- `RankTimeoutError` when ranks still ran at the timeout: its message holds every rank's Python stack,
  dumped by faulthandler on SIGUSR1 before the ranks are killed.

No rank outlives the call: each rank leads its own process group, which is killed on the way out, and a
rank whose parent dies exits by itself. `fn` and `args` must pickle (a module-level function and plain
data), so a persistent pool can replace the spawn later without touching the callers.

This module needs only the standard library here and torch in the ranks, so a cell's environment can
import it through PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 300.0
# After one rank fails, the others get this long to fail or finish on their own (gloo notices a dead
# peer quickly; NCCL waits in the collective until its timeout), then they are killed.
PEER_FAILURE_GRACE_S = 10.0
# How long faulthandler gets to write the stacks of hung ranks before they are killed.
STACK_DUMP_GRACE_S = 5.0
# How often a rank checks that the process that started it is still alive.
ORPHAN_CHECK_INTERVAL_S = 1.0
MIB = 1024 * 1024
DEVICES = ("auto", "cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class RankResult:
    """What one rank returned, and its allocator peaks while `fn` ran (None on CPU)."""

    rank: int
    value: Any
    peak_allocated_mib: float | None
    peak_reserved_mib: float | None


class DistributedError(Exception):
    """A distributed run did not complete on every rank."""


class RankFailedError(DistributedError):
    """A rank raised, or exited without a result. `rank` is the first one that failed."""

    def __init__(self, rank: int, summary: str, details: str, other_failures: list[str]):
        self.rank = rank
        self.summary = summary
        self.details = details
        self.other_failures = other_failures
        text = f"rank {rank} {summary}\n\n{details}"
        if other_failures:
            text += "\nafterwards:\n" + "\n".join(f"  {line}" for line in other_failures)
        super().__init__(text)


class RankTimeoutError(DistributedError):
    """Ranks still ran at the timeout; `stacks` maps each rank to its Python stack (or why there is none)."""

    def __init__(self, timeout_s: float, hung_ranks: list[int], stacks: dict[int, str]):
        self.timeout_s = timeout_s
        self.hung_ranks = hung_ranks
        self.stacks = stacks
        parts = [f"ranks {hung_ranks} still running after {timeout_s:g}s; killed. Python stack of every rank:"]
        parts += [f"--- rank {rank} ---\n{stack.rstrip()}" for rank, stack in sorted(stacks.items())]
        super().__init__("\n".join(parts))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (rank 0's store binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_distributed(
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT_S,
    device: str = "auto",
) -> list[RankResult]:
    """Run `fn(*args)` on `world_size` ranks with torch.distributed initialised; results in rank order.

    `device`: "cuda" (NCCL, GPU `rank` of the visible ones), "cpu" (gloo), or "auto" (cuda when there).
    `timeout` bounds the whole run and each collective (init_process_group's timeout).
    """
    payload = pickle_call(world_size, fn, args, device, caller="run_distributed")
    with tempfile.TemporaryDirectory(prefix="harness-ranks-") as workdir_name:
        workdir = Path(workdir_name)
        context = multiprocessing.get_context("spawn")
        launch = Launch(world_size=world_size, port=free_port(), workdir=str(workdir),
                        timeout_s=timeout, device=device, parent_pid=os.getpid())
        processes = [
            context.Process(target=_rank_main, args=(launch, rank, payload), name=f"harness-rank{rank}")
            for rank in range(world_size)
        ]
        try:
            for process in processes:
                process.start()
            return _collect(processes, workdir, timeout)
        finally:
            _kill(processes)


def pickle_call(world_size: int, fn: Callable[..., Any], args: tuple, device: str, caller: str) -> bytes:
    """The pickled `(fn, args)` the ranks run, after refusing bad arguments before any rank starts."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    try:
        return pickle.dumps((fn, args))
    except Exception as error:
        raise TypeError(f"{caller} needs a module-level function and picklable arguments; {error}") from error


# ---------------------------------------------------------------- parent side


def _collect(processes: list[multiprocessing.Process], workdir: Path, timeout_s: float) -> list[RankResult]:
    deadline = time.monotonic() + timeout_s
    failure_seen_at: float | None = None
    while True:
        running = [p for p in processes if p.exitcode is None]
        if not running:
            break
        now = time.monotonic()
        if failure_seen_at is None and _failures(processes, workdir):
            failure_seen_at = now
        if failure_seen_at is not None and now - failure_seen_at > PEER_FAILURE_GRACE_S:
            break
        if now > deadline:
            if not _failures(processes, workdir):
                raise _timeout_error(processes, workdir, timeout_s)
            break
        multiprocessing.connection.wait([p.sentinel for p in running], timeout=0.1)

    failures = _failures(processes, workdir)
    if failures:
        failures.sort(key=lambda failure: failure[0])
        _, rank, summary, details = failures[0]
        others = [f"rank {other_rank} {other_summary}" for _, other_rank, other_summary, _ in failures[1:]]
        others += [f"rank {p_rank} was still running and was killed"
                   for p_rank, p in enumerate(processes) if p.exitcode is None]
        raise RankFailedError(rank, summary, details, others)

    results = []
    for rank in range(len(processes)):
        outcome = _read_pickle(_result_path(workdir, rank))
        results.append(RankResult(rank=rank, value=outcome["value"],
                                  peak_allocated_mib=outcome["peak_allocated_mib"],
                                  peak_reserved_mib=outcome["peak_reserved_mib"]))
    return results


def _failures(processes: list[multiprocessing.Process], workdir: Path) -> list[tuple[tuple, int, str, str]]:
    """(sort key, rank, one-line summary, details) for each rank that raised or exited without a result.

    A rank that died without a word sorts first: its peers' errors (a connection reset) follow from it, and
    when it died is unknown (only when it was noticed). Then the earliest error."""
    failures = []
    for rank, process in enumerate(processes):
        error = _read_pickle(_error_path(workdir, rank))
        if error is not None:
            failures.append(((1, error["failed_at"]), rank,
                             f"raised {error['error_type']}: {error['error_message']}", error["traceback"]))
        elif process.exitcode is not None and not _result_path(workdir, rank).exists():
            stack = read_stack(workdir, rank)
            details = f"last Python stack of rank {rank}:\n{stack}" if stack else "no Python stack was written"
            failures.append(((0, rank), rank, f"exited {describe_exit(process.exitcode)} without a result",
                             details))
    return failures


def _timeout_error(processes: list[multiprocessing.Process], workdir: Path, timeout_s: float) -> RankTimeoutError:
    hung = [rank for rank, p in enumerate(processes) if p.exitcode is None]
    for rank in hung:
        signal_process(processes[rank], signal.SIGUSR1)
    wait_for_stacks(workdir, hung)
    stacks = {}
    for rank, process in enumerate(processes):
        if rank in hung:
            stacks[rank] = read_stack(workdir, rank) or "(no stack written: the rank did not answer SIGUSR1)"
        else:
            stacks[rank] = f"(finished, exit {describe_exit(process.exitcode)})"
    return RankTimeoutError(timeout_s, hung, stacks)


def wait_for_stacks(workdir: Path, ranks: list[int]) -> None:
    """Until every rank's stack file is written and has stopped growing, or the grace period ends."""
    grace_end = time.monotonic() + STACK_DUMP_GRACE_S
    sizes: dict[int, int] = {}
    while time.monotonic() < grace_end:
        time.sleep(0.1)
        now = {rank: len(read_stack(workdir, rank)) for rank in ranks}
        if all(now.values()) and now == sizes:
            return
        sizes = now


def _kill(processes: list[multiprocessing.Process]) -> None:
    for process in processes:
        if process.pid is None:
            continue
        signal_process(process, signal.SIGKILL)
    for process in processes:
        if process.pid is not None:
            process.join(timeout=10)
            process.close()


def signal_process(process: multiprocessing.Process, signum: int) -> None:
    """Signal the rank's whole process group (the rank leads it); fall back to the rank alone."""
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "(exit status unknown)"
    if exitcode < 0:
        return f"by signal {signal.Signals(-exitcode).name}"
    return f"with code {exitcode}"


def _result_path(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"result.rank{rank}.pickle"


def _error_path(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"error.rank{rank}.pickle"


def stack_path(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"stack.rank{rank}.txt"


def _read_pickle(path: Path) -> dict[str, Any] | None:
    try:
        return pickle.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def read_stack(workdir: Path, rank: int) -> str:
    try:
        return stack_path(workdir, rank).read_text(errors="replace")
    except FileNotFoundError:
        return ""


# ---------------------------------------------------------------- rank side


@dataclasses.dataclass(frozen=True)
class Launch:
    world_size: int
    port: int
    workdir: str
    timeout_s: float
    device: str
    parent_pid: int


def _rank_main(launch: Launch, rank: int, payload: bytes) -> None:
    # Lead a process group of our own, so the parent can kill this rank and whatever it started.
    os.setpgrp()
    stack_file = open(stack_path(Path(launch.workdir), rank), "w")  # noqa: SIM115 - open until exit
    faulthandler.enable(file=stack_file, all_threads=True)  # a crash leaves its stack here
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    threading.Thread(target=exit_when_orphaned, args=(launch.parent_pid,), name="harness-orphan-check",
                     daemon=True).start()
    workdir = Path(launch.workdir)
    failed = False
    try:
        data, path = pickle.dumps(_run_rank(launch, rank, payload)), _result_path(workdir, rank)
    except BaseException as error:  # a result that does not pickle lands here too
        failed = True
        failure = {"failed_at": time.time(), "error_type": type(error).__qualname__,
                   "error_message": first_line(error), "traceback": traceback.format_exc()}
        data, path = pickle.dumps(failure), _error_path(workdir, rank)
    # Written whole, then renamed: the parent never reads half a file.
    temporary = path.with_suffix(".partial")
    temporary.write_bytes(data)
    os.replace(temporary, path)
    sys.stdout.flush()
    sys.stderr.flush()
    if failed:
        # Skip interpreter teardown: after a failure a peer may hang a collective the exit hooks wait on.
        os._exit(1)


def set_environment(launch: Launch, rank: int) -> None:
    os.environ.update({
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(launch.port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(launch.world_size),
        "LOCAL_WORLD_SIZE": str(launch.world_size),
    })
    # Every rank is on this host: keep gloo on the loopback device, whatever the host name resolves to.
    if "GLOO_SOCKET_IFNAME" not in os.environ and any(name == "lo" for _, name in socket.if_nameindex()):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    # Share the cores between the ranks instead of each rank starting a thread per core.
    threads = max(1, (os.cpu_count() or 1) // launch.world_size)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def init_rank_process_group(launch: Launch, rank: int) -> bool:
    """Set this rank's environment, select its GPU and join the process group (`launch.timeout_s` bounds
    each collective); True when the rank uses CUDA and NCCL, False for gloo on CPU."""
    set_environment(launch, rank)  # before torch is imported, which reads OMP_NUM_THREADS once
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    use_cuda = launch.device == "cuda" or (launch.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        if rank >= torch.cuda.device_count():
            raise RuntimeError(f"rank {rank} needs GPU {rank}, but {torch.cuda.device_count()} are visible")
        torch.cuda.set_device(rank)
    # A rank forked with torch already imported missed OMP_NUM_THREADS: its thread count is set here.
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo",
        rank=rank,
        world_size=launch.world_size,
        timeout=timedelta(seconds=launch.timeout_s),
        device_id=torch.device("cuda", rank) if use_cuda else None,
    )
    return use_cuda


def _run_rank(launch: Launch, rank: int, payload: bytes) -> dict[str, Any]:
    use_cuda = init_rank_process_group(launch, rank)
    import torch
    import torch.distributed as dist

    fn, args = pickle.loads(payload)
    if use_cuda:
        torch.cuda.reset_peak_memory_stats()
    value = fn(*args)
    peak_allocated = peak_reserved = None
    if use_cuda:
        torch.cuda.synchronize()
        peak_allocated = torch.cuda.max_memory_allocated() / MIB
        peak_reserved = torch.cuda.max_memory_reserved() / MIB
    dist.destroy_process_group()
    return {"value": value, "peak_allocated_mib": peak_allocated, "peak_reserved_mib": peak_reserved}


def exit_when_orphaned(parent_pid: int) -> None:
    """Exit once the launcher `parent_pid` is gone. It is this rank's OS parent, or, for the pool's forked
    ranks, its grandparent through the zygote, which may exit first: so liveness decides, not getppid."""
    while launcher_alive(parent_pid):
        time.sleep(ORPHAN_CHECK_INTERVAL_S)
    os._exit(3)


def launcher_alive(pid: int) -> bool:
    if os.getppid() == pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie, dead but not yet reaped, is gone too
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return not Path("/proc/self").exists()  # no /proc: trust kill; else it went between the two calls
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"
