"""What passes between the launcher and its ranks, its zygote and its hosts' agents: the messages and the
deadlines they keep (the errors a launch raises are in failures.py).

Messages are frozen dataclasses pickled over a Unix socket (launcher <-> rank), a pipe (launcher <-> zygote) or,
between hosts, TLS (harness.ranks.tls); nothing between processes is a bare tuple. Needs only the standard library.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from typing import Any

from harness.ranks.raised import PeerFailure, RaisingFrame, first_line, raising_frame

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
    # MASTER_PORT. Across hosts rank 0's TCPStore listens there, on master_addr alone; on one host nothing of harness
    # does (the ranks meet through a FileStore in workdir): it is set for code that builds a store of its own.
    port: int
    workdir: str  # the ranks' stack files, their rendezvous file on one host, and the launcher's socket (0700)
    collective_timeout_s: float
    device: str
    launcher_pid: int  # the process whose death ends every rank
    # Across hosts (harness/ranks/hosts.py): host 0's address, and ranks per host (0: every rank is here).
    master_addr: str = "127.0.0.1"
    ranks_per_host: int = 0
    capture: OutputCapture | None = None  # None: the ranks write where their fds point (pytest -s)
    # A 0700 folder of the launcher's session that ranks hand results on through to later tests' ranks
    # (harness.ranks.handover); None: nothing is handed on.
    handover_dir: str | None = None

    @property
    def local_world_size(self) -> int:
        return self.ranks_per_host or self.world_size

    @property
    def single_host(self) -> bool:
        """Every rank is on the launcher's host."""
        return self.world_size <= self.local_world_size


@dataclasses.dataclass(frozen=True)
class RankSpec:
    launch: Launch
    rank: int
    address: str | tuple[str, int]  # the launcher's Unix socket, or its TCP listener in a cell across hosts
    authkey: bytes  # on one host: answers the launcher's challenge, so only its ranks may connect (else empty)
    environ: dict[str, str]  # the launcher's environment (a forked rank starts with the zygote's)
    # A rank on another host than the launcher's: its host's own environment, whose host-local names
    # (SLURM_*, HOSTNAME, TMPDIR, ...) win over the launcher's in every call (hosts.for_host).
    host_environ: dict[str, str] | None = None
    # Across hosts: the path, on the rank's host, of the cell's TLS credentials the rank dials its launcher with
    # (harness.ranks.tls). None: one host, the Unix socket and its challenge.
    credentials: str | None = None


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
class Audit:
    """A test has ended: put back what it left that a fresh rank would not have (harness.ranks.boundary); answered
    with Pong, whose `unfit` names what would not go back (the launcher then retires the set)."""


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
    def from_exception(cls, error: BaseException, *, traceback_text: str | None = None, **fields: Any) -> Failed:
        """`traceback_text`: the traceback as the rank tells it (default: the exception being handled, whole)."""
        return cls(failed_at=time.time(), error_type=type(error).__qualname__, error_message=first_line(error),
                   traceback=traceback.format_exc() if traceback_text is None else traceback_text,
                   follows_peer=isinstance(error, PeerFailure), error_frame=raising_frame(error), **fields)


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
