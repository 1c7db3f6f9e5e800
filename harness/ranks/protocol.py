"""What passes between the launcher and its ranks, and the errors a launch raises: one set of types, one
failure ordering, one set of messages, for the spawned ranks and the pool alike.

Messages are frozen dataclasses pickled over a Unix socket (launcher <-> rank) or a pipe (launcher <->
zygote); nothing between processes is a bare tuple. Needs only the standard library.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
import traceback
from typing import Any

DEFAULT_TIMEOUT_S = 300.0
# Starting ranks (importing torch, forming the process group) has its own deadline, so a busy machine that
# is slow to start ranks never eats into the time a test's function is given.
BOOTSTRAP_TIMEOUT_S = 300.0
# After the first failure the other ranks get this long to report: gloo peers of a rank that exited fail
# within milliseconds; NCCL peers, and peers of a rank that raised and lives on, wait in their collective.
PEER_FAILURE_GRACE_S = 3.0
# How long faulthandler gets to write the stacks of the ranks still running before they are killed.
STACK_DUMP_GRACE_S = 5.0
# A collective may last this much longer than the launch's deadline: the launcher, not a rank's own
# collective timeout, decides a hang, so the hung rank's stack is collected before any peer gives up.
COLLECTIVE_TIMEOUT_MARGIN_S = STACK_DUMP_GRACE_S + PEER_FAILURE_GRACE_S + 30.0
MIB = 1024 * 1024
DEVICES = ("auto", "cpu", "cuda")


def collective_timeout(launch_timeout_s: float) -> float:
    """The process group's timeout for launches of up to `launch_timeout_s`."""
    return launch_timeout_s + COLLECTIVE_TIMEOUT_MARGIN_S


# ---------------------------------------------------------------- launch description


@dataclasses.dataclass(frozen=True)
class OutputCapture:
    """Ranks capture their fds 1 and 2 per call (harness.ranks.output); what they write outside calls is
    appended to `log` (None: it goes where their fds pointed when they started)."""

    log: str | None = None


@dataclasses.dataclass(frozen=True)
class RankOutput:
    """What one rank wrote to its fds 1 and 2 during a call: decoded (invalid UTF-8 replaced) and capped, the
    head and the tail kept with a line between them saying how much was cut."""

    stdout: str = ""
    stderr: str = ""


@dataclasses.dataclass(frozen=True)
class Launch:
    """What every rank of one set of ranks shares."""

    world_size: int
    port: int  # rank 0's TCP store
    workdir: str  # the ranks' stack files and the launcher's socket
    collective_timeout_s: float
    device: str
    launcher_pid: int  # the process whose death ends every rank
    # Across hosts (harness/ranks/hosts.py): host 0's address, and ranks per host (0: every rank is here).
    master_addr: str = "127.0.0.1"
    ranks_per_host: int = 0
    capture: OutputCapture | None = None  # None: the ranks write where their fds point (pytest -s)

    @property
    def local_world_size(self) -> int:
        return self.ranks_per_host or self.world_size


@dataclasses.dataclass(frozen=True)
class RankSpec:
    launch: Launch
    rank: int
    address: str  # the launcher's Unix socket
    authkey: bytes  # answers the launcher's challenge: only its ranks may connect
    environ: dict[str, str]  # the launcher's environment (a forked rank starts with the zygote's)
    # A rank on another host than the launcher's: its host's own environment, whose host-local names
    # (SLURM_*, HOSTNAME, TMPDIR, ...) win over the launcher's in every call (hosts.for_host).
    host_environ: dict[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class RankResult:
    """What one rank returned, its allocator peaks while `fn` ran (None on CPU) and what it wrote (None: not
    captured)."""

    rank: int
    value: Any
    peak_allocated_mib: float | None
    peak_reserved_mib: float | None
    output: RankOutput | None = None


# ---------------------------------------------------------------- launcher -> rank


@dataclasses.dataclass(frozen=True)
class Call:
    payload: bytes  # pickled (fn, args)
    sys_path: list[str]
    environ: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Ping:
    """Are you alive and idle? Answered with Pong once the rank has put back what its last call changed."""


@dataclasses.dataclass(frozen=True)
class Probe:
    """After a call that failed on some ranks but was answered by all: one collective on the world group, to
    show the pool can serve the next call."""


# ---------------------------------------------------------------- rank -> launcher


@dataclasses.dataclass(frozen=True)
class Hello:
    rank: int


@dataclasses.dataclass(frozen=True)
class Ready:
    """The rank formed its process group."""


@dataclasses.dataclass(frozen=True)
class Pong:
    """Alive and idle. `unfit`: what the rank's last call left that it could not put back (a fresh rank would
    not have it); the launcher then retires the rank set."""

    unfit: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Done:
    value: Any
    seconds: float | None
    peak_allocated_mib: float | None
    peak_reserved_mib: float | None
    modules: list[str]  # modules the rank imported during the call (the zygote imports them next)
    output: RankOutput | None = None


@dataclasses.dataclass(frozen=True)
class RaisingFrame:
    """The innermost Python frame of an exception's traceback: where it was raised (or, for an error raised in
    C++, the Python line that called into it). `file` is relative to the sys.path entry that holds it
    (`torch/distributed/tensor/placement_types.py`), so it reads the same in every environment and on every host;
    `function` is the code's name (not its qualname: Python 3.10 has none)."""

    file: str
    function: str
    line: int

    @property
    def location(self) -> str:
        """`file:function`: what a known bug's `raised_at` names. The line is left out: it moves between patch
        releases of the package that raises."""
        return f"{self.file}:{self.function}"

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclasses.dataclass(frozen=True)
class Failed:
    """The rank raised; it stays alive when the failure left it able to serve (`alive`)."""

    failed_at: float  # time.time(), to order failures across ranks
    error_type: str
    error_message: str
    traceback: str
    seconds: float | None = None
    modules: list[str] = dataclasses.field(default_factory=list)
    alive: bool = True
    follows_peer: bool = False  # PeerFailure: it failed because another rank did (agree.together)
    error_frame: RaisingFrame | None = None  # None: the exception carried no traceback
    output: RankOutput | None = None

    @classmethod
    def from_exception(cls, error: BaseException, **fields: Any) -> Failed:
        return cls(failed_at=time.time(), error_type=type(error).__qualname__, error_message=first_line(error),
                   traceback=traceback.format_exc(), follows_peer=isinstance(error, PeerFailure),
                   error_frame=raising_frame(error), **fields)


class PeerFailure(Exception):
    """Raised on a rank whose own check passed while a peer's failed (agree.together): never the reported
    failure while a rank has one of its own."""


# ---------------------------------------------------------------- launcher <-> zygote


@dataclasses.dataclass(frozen=True)
class Preload:
    modules: list[str]
    sys_path: list[str]


@dataclasses.dataclass(frozen=True)
class Fork:
    specs: list[RankSpec]


@dataclasses.dataclass(frozen=True)
class Forked:
    pids: list[int]


@dataclasses.dataclass(frozen=True)
class Refused:
    """Forking the zygote became unsafe; `bare`: importing torch alone made it so."""

    reason: str
    bare: bool


@dataclasses.dataclass(frozen=True)
class Exited:
    pid: int
    exit_code: int  # negative: killed by that signal


# ---------------------------------------------------------------- launcher <-> host agent (across hosts)
# The agent relays Preload and Fork to its host's zygote and answers Forked / Refused / Exited as a zygote
# does; these are what only a host adds.


@dataclasses.dataclass(frozen=True)
class AgentHello:
    host: int  # the host's index in the cell (0 runs pytest)
    hostname: str
    pid: int


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """Sent both ways every HEARTBEAT_INTERVAL_S: a host silent for HOST_LOST_AFTER_S is lost."""


@dataclasses.dataclass(frozen=True)
class StackRequest:
    """The Python stacks of these ranks (rank -> pid) on the agent's host, and their stack files as written."""

    pids: dict[int, int]
    signal_first: bool  # SIGUSR1 first (running ranks), or only read what a dead rank left


@dataclasses.dataclass(frozen=True)
class Stacks:
    stacks: dict[int, str]
    outputs: dict[int, RankOutput] = dataclasses.field(default_factory=dict)  # what each wrote in its call so far


@dataclasses.dataclass(frozen=True)
class KillRanks:
    pids: list[int]


HEARTBEAT_INTERVAL_S = 1.0
HOST_LOST_AFTER_S = 10.0


# ---------------------------------------------------------------- errors


class DistributedError(Exception):
    """A launch did not complete on every rank. `rank_seconds`: how long fn ran on each rank (None: unknown);
    `rank_modules`: what the ranks imported (the pool preloads them); `rank_outputs`: what each rank wrote in
    the call, up to its end or the moment it died or was killed (empty: not captured)."""

    def __init__(self, text: str, rank_seconds: list[float | None], rank_modules: list[str],
                 rank_outputs: dict[int, RankOutput] | None = None):
        super().__init__(text)
        self.rank_seconds = rank_seconds
        self.rank_modules = rank_modules
        self.rank_outputs = rank_outputs or {}


class RankFailedError(DistributedError):
    """A rank raised, or exited without a result. `rank` is the first one that failed; `other_failures` the
    collateral: later errors, and the ranks still running with their stacks. `error_type` / `error_message`:
    what that rank raised (its exception's qualname and first line), as data for whoever matches on it (the
    suite's known upstream bugs), and `error_frame` where it raised it; None when it exited without a word."""

    def __init__(self, rank: int, summary: str, details: str, other_failures: list[str], *,
                 rank_seconds: list[float | None] | None = None, rank_modules: list[str] | None = None,
                 error_type: str | None = None, error_message: str | None = None,
                 error_frame: RaisingFrame | None = None,
                 rank_outputs: dict[int, RankOutput] | None = None):
        self.rank = rank
        self.error_type = error_type
        self.error_message = error_message
        self.error_frame = error_frame
        self.summary = summary
        self.details = details
        self.other_failures = other_failures
        text = f"rank {rank} {summary}\n\n{details}"
        if other_failures:
            text += "\nafterwards:\n" + "\n".join(f"  {line}" for line in other_failures)
        super().__init__(text, rank_seconds or [], rank_modules or [], rank_outputs)


class RankTimeoutError(DistributedError):
    """Ranks still ran at the deadline; `stacks` maps each rank to its Python stack (or what it did).
    `hung_first`: the ranks that were not waiting in a torch.distributed call, so the others wait for them;
    their stacks come first."""

    def __init__(self, timeout_s: float, hung_ranks: list[int], stacks: dict[int, str], *,
                 rank_seconds: list[float | None] | None = None, rank_outputs: dict[int, RankOutput] | None = None):
        self.timeout_s = timeout_s
        self.hung_ranks = hung_ranks
        self.stacks = stacks
        waiting = [rank for rank in hung_ranks if in_collective(stacks.get(rank, ""))]
        self.hung_first = [rank for rank in hung_ranks if rank not in waiting]
        head = f"ranks {hung_ranks} still running after {timeout_s:g}s; killed."
        if self.hung_first and waiting:
            head += f" Hung first: ranks {self.hung_first}; ranks {waiting} waited for them in a collective."
        parts = [f"{head} Python stack of every rank:"]
        order = self.hung_first + waiting + sorted(rank for rank in stacks if rank not in hung_ranks)
        parts += [f"--- rank {rank} ---\n{stacks[rank].rstrip()}" for rank in order]
        super().__init__("\n".join(parts), rank_seconds or [], [], rank_outputs)


class HostLostError(DistributedError):
    """A host of the cell went silent (no heartbeat) or its agent's connection closed: the cell cannot go on.
    `host` is the one that went silent first, which is not always the one whose connection closed first."""

    def __init__(self, host: int, hostname: str, reason: str):
        self.host = host
        self.hostname = hostname
        self.reason = reason
        super().__init__(f"host {host} ({hostname}) lost: {reason}", [], [])


def in_collective(stack: str) -> bool:
    """Whether faulthandler's dump shows the rank's current thread inside torch.distributed (innermost frame
    first): a rank there waits for its peers."""
    current = stack.split("Current thread", 1)
    frames = [line.strip() for line in current[1].splitlines()[1:] if line.strip().startswith("File ")] \
        if len(current) == 2 else []
    return bool(frames) and f"{os.sep}torch{os.sep}distributed{os.sep}" in frames[0]


# ---------------------------------------------------------------- building the errors


NO_STACK = "(no stack written: the rank did not answer SIGUSR1)"


@dataclasses.dataclass(frozen=True)
class Died:
    """A rank that exited without a word: `exit_code` as multiprocessing reports it (None: unknown)."""

    exit_code: int | None
    last_stack: str
    output: RankOutput | None = None  # what it wrote in the call before it died, read from its files


def failure_error(world_size: int, replies: dict[int, Done], failures: dict[int, Failed | Died],
                  running_stacks: dict[int, str], running_outputs: dict[int, RankOutput] | None = None
                  ) -> RankFailedError:
    """The error for a launch in which `failures` happened, naming first the rank that failed first.

    A rank that died without a word sorts first: its peers' errors (a connection reset) follow from it, and
    when it died is unknown (only when it was noticed). Then the earliest error of a rank's own, then the
    ranks that stopped because a peer failed; the ranks still running (with their stacks) come last."""
    found = []
    for rank, failure in failures.items():
        if isinstance(failure, Failed):
            order = (2 if failure.follows_peer else 1, failure.failed_at)
            found.append((order, rank, f"raised {failure.error_type}: {failure.error_message}",
                          failure.traceback, failure))
        else:
            details = (f"last Python stack of rank {rank}:\n{failure.last_stack}" if failure.last_stack
                       else "no Python stack was written")
            found.append(((0, rank), rank, f"exited {describe_exit(failure.exit_code)} without a result", details,
                          None))
    found.sort(key=lambda entry: entry[0])
    _, rank, summary, details, raised = found[0]
    others = [f"rank {other} {other_summary}" for _, other, other_summary, _, _ in found[1:]]
    others += [f"rank {other} was still running and was killed; its Python stack:\n{stack.rstrip()}"
               for other, stack in sorted(running_stacks.items())]
    seconds = [_seconds(replies.get(each) or failures.get(each)) for each in range(world_size)]
    modules = [name for outcome in (*replies.values(), *failures.values()) for name in getattr(outcome, "modules", ())]
    return RankFailedError(rank, summary, details, others, rank_seconds=seconds, rank_modules=modules,
                           error_type=raised.error_type if raised else None,
                           error_message=raised.error_message if raised else None,
                           error_frame=raised.error_frame if raised else None,
                           rank_outputs=_outputs(replies, failures, running_outputs))


def timeout_error(world_size: int, timeout_s: float, replies: dict[int, Done],
                  running_stacks: dict[int, str], running_outputs: dict[int, RankOutput] | None = None
                  ) -> RankTimeoutError:
    stacks = dict(running_stacks)
    stacks.update({rank: "(finished: returned its result)" for rank in replies})
    return RankTimeoutError(timeout_s, sorted(running_stacks), stacks,
                            rank_seconds=[_seconds(replies.get(rank)) for rank in range(world_size)],
                            rank_outputs=_outputs(replies, {}, running_outputs))


def _seconds(outcome: Any) -> float | None:
    return getattr(outcome, "seconds", None)


def _outputs(replies: dict[int, Done], failures: dict[int, Failed | Died],
             running_outputs: dict[int, RankOutput] | None) -> dict[int, RankOutput]:
    """Each rank's output in a launch that failed: from its answer, or as read from its files (no answer)."""
    outputs = {rank: outcome.output for rank, outcome in (*replies.items(), *failures.items())
               if outcome.output is not None}
    return {**outputs, **(running_outputs or {})}


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "(exit status unknown)"
    if exitcode < 0:
        return f"by signal {signal.Signals(-exitcode).name}"
    return f"with code {exitcode}"


NO_MESSAGE = "(no message)"  # the first line of an exception raised without one (a bare `assert`)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else NO_MESSAGE


def raising_frame(error: BaseException) -> RaisingFrame | None:
    """Where `error` was raised: its traceback's innermost frame, its file relative to the sys.path entry that
    holds it (the longest, so a venv's site-packages wins over a folder above it)."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return None
    innermost = frames[-1]
    return RaisingFrame(file=relative_to_sys_path(innermost.filename), function=innermost.name,
                        line=innermost.lineno or 0)


def relative_to_sys_path(filename: str) -> str:
    """`filename` relative to the longest sys.path entry it is under, with `/` between parts; its base name
    where none holds it (an absolute path would name this host's folders)."""
    path = os.path.abspath(filename)
    roots = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    holding = [root for root in roots if path.startswith(root.rstrip(os.sep) + os.sep)]
    if not holding:
        return os.path.basename(path)
    return os.path.relpath(path, max(holding, key=len)).replace(os.sep, "/")
