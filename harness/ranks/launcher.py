"""The launcher's side of the protocol for one set of ranks (`RankSet`): start them (spawned here, or
forked by the zygote), wait until they formed their process group, check they are alive and idle, send a
call and gather one answer per rank, and kill them. `spawn.run_distributed` uses one set per call; the
pool keeps sets between calls.

Deadlines: starting ranks has its own (`BOOTSTRAP_TIMEOUT_S`), and a call's timeout starts when the call
is sent, so a machine slow to start ranks never turns into a false timeout. On any failure or hang the
ranks still running are asked for their Python stacks (faulthandler, on SIGUSR1) before they are killed, and
what the ranks that sent no answer wrote in the call is read from their output files.
Needs only the standard library; the ranks run harness.ranks.rank.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from harness.ranks import lifecycle, stacks, tls
from harness.ranks.failures import Died, DistributedError, failure_error, hidden_from_a_failure, timeout_error
from harness.ranks.hosts import Placement
from harness.ranks.output import output_paths, read_output
from harness.ranks.ports import port_outside_ephemeral_range
from harness.ranks.protocol import (
    BOOTSTRAP_TIMEOUT_S,
    DEVICES,
    PEER_FAILURE_GRACE_S,
    Audit,
    Call,
    Done,
    Failed,
    Hello,
    Launch,
    OutputCapture,
    Ping,
    Probe,
    RankOutput,
    RankResult,
    RankSpec,
    Stacks,
)
from harness.ranks.rank import spawned_rank_main, stack_path

POLL_S = 0.1
# A rank answers the launcher's challenge at once; a peer silent this long is not one of our ranks.
HANDSHAKE_TIMEOUT_S = 10.0
HELLO_MAX_BYTES = 4096  # across hosts, what a rank may send before it is one of ours
# A rank answers a Ping once it has put back what its last call changed (a garbage collection, an emptied
# CUDA cache); one that takes longer than this is not used again.
IDLE_CHECK_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 60.0
# How long a dead forked rank's exit status may take to come from the zygote that reaps it. The wait ends when the
# status comes (its connection closed as it exited); 1 s was too short on a loaded machine, where the error then
# said "(exit status unknown)" instead of the signal.
EXIT_STATUS_WAIT_S = 30.0


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


class RankConnection(Protocol):
    """A rank's connection to the launcher: a multiprocessing Connection on one host, a tls.Channel across hosts."""

    def fileno(self) -> int: ...
    def send_bytes(self, buf: bytes, /) -> None: ...
    def recv_bytes(self) -> bytes: ...
    def close(self) -> None: ...


def handshake(sock: socket.socket, authkey: bytes, timeout_s: float) -> multiprocessing.connection.Connection | None:
    """The connection of one of our ranks, or None (the socket closed) for anything else: a peer of another
    user, one that fails the HMAC challenge, or one that sends nothing for `timeout_s` (it would otherwise
    hold the accept loop, and the pool's start, for as long as it liked)."""
    if peer_uid(sock) not in (None, os.getuid()):
        sock.close()
        return None
    sock.setblocking(True)
    # Kernel timeouts, not socket.settimeout: they hold for the plain reads and writes of Connection too.
    seconds, fraction = divmod(timeout_s, 1.0)
    limit = struct.pack("ll", int(seconds), int(fraction * 1_000_000))
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, option, limit)
    connection = multiprocessing.connection.Connection(sock.detach())
    try:
        multiprocessing.connection.deliver_challenge(connection, authkey)
        multiprocessing.connection.answer_challenge(connection, authkey)
    except (multiprocessing.AuthenticationError, EOFError, OSError):
        connection.close()
        return None
    with socket.socket(fileno=os.dup(connection.fileno())) as same:  # a rank's calls may wait as long as they need
        for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
            same.setsockopt(socket.SOL_SOCKET, option, struct.pack("ll", 0, 0))
    return connection


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED); None for a TCP peer (no uid
    crosses hosts) and where the OS cannot tell."""
    if not hasattr(socket, "SO_PEERCRED") or sock.family != socket.AF_UNIX:
        return None
    credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]


def to_results(replies: list[Done]) -> list[RankResult]:
    return [RankResult(rank=rank, value=reply.value, peak_allocated_mib=reply.peak_allocated_mib,
                       peak_reserved_mib=reply.peak_reserved_mib, output=reply.output)
            for rank, reply in enumerate(replies)]


class RankSet:
    """The ranks of one (world size, device): their sockets, stack files and processes."""

    def __init__(self, world_size: int, device: str, collective_timeout_s: float,
                 placement: Placement | None = None, capture: OutputCapture | None = None,
                 handover_dir: str | None = None):
        """`handover_dir`: the session's folder for harness.ranks.handover (one host only)."""
        self.world_size = world_size
        # Across hosts: which host each rank is on; ranks on other hosts are reached through their agent.
        self.placement = placement
        self.device = device
        self.collective_timeout_s = collective_timeout_s
        # False once a rank died, hung or was killed: only an intact set may serve another call.
        self.intact = True
        self.unfit: list[str] = []  # what the last call left that a fresh rank would not have: retire the set
        self.workdir = Path(tempfile.mkdtemp(prefix="harness-pool-"))
        self._authkey = os.urandom(32)
        self._address: str | tuple[str, int]  # a Unix socket's name on one host, (address, port) across hosts
        if placement is None:
            # The ranks meet through a FileStore in workdir (rank.rendezvous_store); MASTER_PORT is only for code
            # that builds a store of its own. Below the ephemeral range: a port the kernel hands out (bind to 0)
            # can go to any process's outgoing connection before that store binds it (seen: EADDRINUSE).
            self.launch = Launch(world_size=world_size, port=port_outside_ephemeral_range(), workdir=str(self.workdir),
                                 collective_timeout_s=collective_timeout_s, device=device,
                                 launcher_pid=os.getpid(), capture=capture, handover_dir=handover_dir)
            # Linux: an abstract socket (no path-length limit, no file left behind), so anyone on the host
            # could connect: the HMAC challenge with a key only the ranks hold comes before anything is unpickled.
            self._address = (f"\0harness-ranks-{uuid.uuid4().hex}" if sys.platform.startswith("linux")
                             else str(self.workdir / "launcher.sock"))
            self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._server.bind(self._address)
        else:
            # Ranks on other hosts dial in over TCP: TLS with the cell's credentials, on host 0's address only. Rank
            # 0's store listens on host 0's address in the cell alone (harness.ranks.rank.rendezvous_store).
            self.launch = Launch(world_size=world_size, port=port_outside_ephemeral_range(placement.master_addr),
                                 workdir=str(self.workdir),
                                 collective_timeout_s=collective_timeout_s, device=device,
                                 launcher_pid=os.getpid(), master_addr=placement.master_addr,
                                 ranks_per_host=placement.ranks_per_host, capture=capture)
            self._authkey = b""  # the certificate admits a rank across hosts, not a key in its spec
            self._context = tls.server_context(placement.credentials)
            self._server = socket.create_server((placement.master_addr, 0))
            self._address = (placement.master_addr, self._server.getsockname()[1])
        self._remote: dict[int, int] = {}  # rank -> its pid on its host (not host 0)
        self._server.listen(world_size)
        self.pids: list[int | None] = [None] * world_size
        self._processes: list[multiprocessing.process.BaseProcess | None] = [None] * world_size  # spawned ranks
        self._connections: list[RankConnection | None] = [None] * world_size
        self._exit_code_of: Callable[[int, float], int | None] | None = None  # forked ranks: the zygote's

    def specs(self) -> list[RankSpec]:
        host_environ = dict(os.environ) if self.placement is not None else None
        credentials = str(self.placement.credentials) if self.placement is not None else None
        return [RankSpec(self.launch, rank, self._address, self._authkey, dict(os.environ), host_environ, credentials)
                for rank in range(self.world_size)]

    def adopt_remote(self, pids: dict[int, int]) -> None:
        """Ranks forked on other hosts by their agents: rank -> pid there."""
        self._remote.update(pids)

    def spawn(self) -> None:
        context = multiprocessing.get_context("spawn")
        for spec in self.specs():
            process = context.Process(target=spawned_rank_main, args=(spec,), name=f"harness-rank{spec.rank}")
            process.start()
            self._processes[spec.rank], self.pids[spec.rank] = process, process.pid

    def adopt(self, pids: list[int], exit_code_of: Callable[[int, float], int | None]) -> None:
        """Ranks forked elsewhere (by the zygote, which reaps them and reports their exit codes)."""
        self.pids = list(pids)
        self._exit_code_of = exit_code_of

    def wait_ready(self, timeout_s: float = BOOTSTRAP_TIMEOUT_S) -> None:
        """Until every rank has connected and formed the process group; raises as a call does."""
        __tracebackhide__ = hidden_from_a_failure
        deadline = time.monotonic() + timeout_s
        self._server.settimeout(POLL_S)
        waiting = set(range(self.world_size))
        while waiting:
            with contextlib.suppress(TimeoutError, socket.timeout):
                sock, _ = self._server.accept()
                left_s = max(deadline - time.monotonic(), POLL_S)
                admitted = self._admit(sock, min(HANDSHAKE_TIMEOUT_S, left_s))
                if admitted is None:
                    continue  # not one of our ranks
                rank, connection = admitted
                self._connections[rank] = connection
                waiting.discard(rank)
                continue
            self._raise_if_host_lost()
            dead = {rank: self._died(rank, wait_s=0) for rank in sorted(waiting)}
            dead = {rank: died for rank, died in dead.items() if died.exit_code is not None}
            if dead or time.monotonic() > deadline:
                self.intact = False
                stacks = self.stacks([rank for rank in sorted(waiting) if rank not in dead])
                if dead:
                    raise failure_error(self.world_size, {}, dead, stacks)
                raise timeout_error(self.world_size, timeout_s, {}, stacks)
        self._server.close()
        self._gather(deadline, timeout_s)

    def _admit(self, sock: socket.socket, timeout_s: float) -> tuple[int, RankConnection] | None:
        """One of our ranks and its connection, once it proved itself and said which rank it is; None for any
        other peer. On one host: the Unix socket's uid check and challenge, then Hello. Across hosts: mutual TLS
        and a small Hello, both within `timeout_s`."""
        connection: RankConnection
        if self.placement is None:
            plain = handshake(sock, self._authkey, timeout_s)
            if plain is None:
                return None
            connection, hello = plain, pickle.loads(plain.recv_bytes())
        else:
            deadline = time.monotonic() + timeout_s
            channel = tls.accept(sock, self._context, deadline)
            if channel is None:
                return None
            try:
                connection, hello = channel, pickle.loads(channel.recv_bytes(HELLO_MAX_BYTES, deadline))
            except Exception:  # EOF, a timeout, a message too large: not a rank of ours after all
                channel.close()
                return None
        if not isinstance(hello, Hello) or not 0 <= hello.rank < self.world_size:
            connection.close()
            return None
        return hello.rank, connection

    def idle(self) -> bool:
        """Every rank alive, idle and as a fresh one: asked, not guessed, so a rank that died between calls, or
        whose last call left what it could not put back (`unfit` says what), is found now."""
        if not self.intact or any(connection is None for connection in self._connections):
            return False
        if not self._send_all(pickle.dumps(Ping())):
            return False
        return self._answered_by_all(IDLE_CHECK_TIMEOUT_S) and not self.unfit

    def audit(self) -> bool:
        """After a test: every rank alive and, once it put back what the test left (harness.ranks.boundary), as a
        fresh one; `unfit` says what would not go back."""
        return self.intact and all(connection is not None for connection in self._connections) and \
            self._send_all(pickle.dumps(Audit())) and self._answered_by_all(IDLE_CHECK_TIMEOUT_S) and not self.unfit

    def probe(self) -> bool:
        """After a call that failed on some ranks and was answered by all: one world collective succeeds."""
        return self.intact and self._send_all(pickle.dumps(Probe())) and \
            self._answered_by_all(PROBE_TIMEOUT_S)

    def call(self, payload: bytes, timeout_s: float) -> list[Done]:
        """Run the pickled `(fn, args)` on every rank; each rank's Done, or the launch's error."""
        __tracebackhide__ = hidden_from_a_failure
        environ = self.placement.environ() if self.placement is not None else dict(os.environ)
        message = pickle.dumps(Call(payload, list(sys.path), environ))
        for rank in range(self.world_size):
            stack_path(self.workdir, rank).write_text("")  # this call's stacks only
            for path in output_paths(self.workdir, rank) if self.launch.capture is not None else ():
                path.write_bytes(b"")  # and its output only, even from a rank that dies before it starts
        self._send_all(message)  # a rank that is gone shows as a closed connection when gathered
        try:
            return self._gather(time.monotonic() + timeout_s, timeout_s)
        except DistributedError:
            raise
        except BaseException as error:  # pytest-timeout or Ctrl-C cut the wait short: what the ranks wrote goes along
            with contextlib.suppress(Exception):
                # A DistributedError declares the attribute; any other exception (a timeout, Ctrl-C) gets it here.
                error.rank_outputs = self.outputs(list(range(self.world_size)))  # type: ignore[attr-defined]
            raise

    def _send_all(self, message: bytes) -> bool:
        sent = True
        for connection in self._connections:
            if connection is None:  # never connected, or closed by kill(): as a rank that is gone
                sent = False
                continue
            try:
                connection.send_bytes(message)
            except OSError:
                sent = False
        return sent

    def _answered_by_all(self, timeout_s: float) -> bool:
        try:
            pongs = self._gather(time.monotonic() + timeout_s, timeout_s)
        except Exception:
            self.intact = False
            return False
        # The first rank's words stand for all: the ranks ran the same function.
        self.unfit = self.unfit or next((pong.unfit for pong in pongs if getattr(pong, "unfit", None)), [])
        return True

    def _gather(self, deadline: float, timeout_s: float) -> list[Any]:
        """One answer from every rank. A failure gives the others PEER_FAILURE_GRACE_S to answer; then the
        ranks still running give their stacks, and the error names the first failure."""
        __tracebackhide__ = hidden_from_a_failure
        replies: dict[int, Any] = {}
        failures: dict[int, Failed | Died] = {}
        failure_seen_at: float | None = None
        while len(replies) + len(failures) < self.world_size:
            self._raise_if_host_lost()
            now = time.monotonic()
            if (failure_seen_at is not None and now - failure_seen_at > PEER_FAILURE_GRACE_S) or now > deadline:
                break
            pending = {self._connections[rank]: rank for rank in range(self.world_size)
                       if rank not in replies and rank not in failures}
            for connection in tls.wait(list(pending), timeout=POLL_S):
                rank = pending[connection]
                try:
                    answer = pickle.loads(connection.recv_bytes())
                except (EOFError, OSError):
                    answer = self._died(rank, wait_s=EXIT_STATUS_WAIT_S)
                except Exception as error:  # a value this process cannot unpickle
                    answer = Failed.from_exception(error)
                if isinstance(answer, (Failed, Died)):
                    failures[rank] = answer
                    failure_seen_at = failure_seen_at or time.monotonic()
                else:
                    replies[rank] = answer
        running = [rank for rank in range(self.world_size) if rank not in replies and rank not in failures]
        if running or any(isinstance(f, Died) or not f.alive for f in failures.values()):
            self.intact = False
        if failures:
            raise failure_error(self.world_size, replies, failures, self.stacks(running), self.outputs(running))
        if running:
            raise timeout_error(self.world_size, timeout_s, replies, self.stacks(running), self.outputs(running))
        return [replies[rank] for rank in range(self.world_size)]

    def stacks(self, ranks: list[int]) -> dict[int, str]:
        """The Python stack of each of `ranks`, still running: faulthandler writes them on SIGUSR1. Ranks on
        other hosts: their agents signal them and send the stacks back."""
        remote = {rank: self._remote[rank] for rank in ranks if rank in self._remote}
        ranks = [rank for rank in ranks if rank not in remote]
        found = self._ask_agents(remote, signal_first=True).stacks
        stacks.collect(self.workdir, {rank: pid for rank in ranks if (pid := self.pids[rank]) is not None},
                       clear=False)
        found.update({rank: stacks.read_stack(self.workdir, rank) or
                      "(no stack written: the rank did not answer SIGUSR1)" for rank in ranks})
        return found

    def outputs(self, ranks: list[int]) -> dict[int, RankOutput]:
        """What each of `ranks` wrote in the current call so far, read from its files (ranks on other hosts: by
        their agents); empty when the ranks do not capture."""
        if self.launch.capture is None:
            return {}
        remote = {rank: self._remote[rank] for rank in ranks if rank in self._remote}
        found = self._ask_agents(remote, signal_first=False).outputs
        found.update({rank: read_output(output_paths(self.workdir, rank)) for rank in ranks if rank not in remote})
        return found

    def _ask_agents(self, pids: dict[int, int], signal_first: bool) -> Stacks:
        """The stacks and outputs of ranks on other hosts (rank -> pid there), from their hosts' agents."""
        found = Stacks({}, {})
        if self.placement is None:
            return found
        by_host: dict[int, dict[int, int]] = {}
        for rank, pid in pids.items():
            by_host.setdefault(self.placement.host_of(rank), {})[rank] = pid
        for host, host_pids in by_host.items():
            reply = self.placement.hub.stacks(host, host_pids, signal_first)
            found.stacks.update(reply.stacks)
            found.outputs.update(reply.outputs)
        return found

    def _raise_if_host_lost(self) -> None:
        __tracebackhide__ = hidden_from_a_failure
        if self.placement is not None and self.placement.hub.loss is not None:
            self.intact = False
            raise self.placement.hub.loss

    def _died(self, rank: int, wait_s: float) -> Died:
        if rank in self._remote:
            assert self.placement is not None  # ranks on other hosts (adopt_remote) exist only with a placement
            host = self.placement.host_of(rank)
            left = self._ask_agents({rank: self._remote[rank]}, signal_first=False)
            return Died(exit_code=self.placement.hub.exit_code(host, self._remote[rank], wait_s),
                        last_stack=left.stacks.get(rank, ""), output=left.outputs.get(rank))
        exit_code = None
        process = self._processes[rank]
        if process is not None:
            process.join(wait_s)
            exit_code = process.exitcode
        elif (pid := self.pids[rank]) is not None and self._exit_code_of is not None:
            exit_code = self._exit_code_of(pid, wait_s)
        return Died(exit_code=exit_code, last_stack=stacks.read_stack(self.workdir, rank),
                    output=self.outputs([rank]).get(rank))

    def kill(self) -> None:
        """Kill every rank (and what it started) and remove the work folder; safe to call twice."""
        self.intact = False
        for rank, pid in enumerate(self.pids):
            if pid is not None and rank not in self._remote:
                lifecycle.signal_group(pid, signal.SIGKILL)
        if self.placement is not None:
            for host, ranks in self.placement.remote_ranks().items():
                self.placement.hub.kill(host, [self._remote[rank] for rank in ranks if rank in self._remote])
        for connection in self._connections:
            if connection is not None:
                connection.close()
        self._connections = [None] * self.world_size
        for process in self._processes:
            if process is not None:
                process.join(10)
                process.close()
        self._processes = [None] * self.world_size
        self._server.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

