"""A host's agent in a cell across hosts (every host but 0): it dials host 0's hub, keeps a zygote of its own
and forks this host's ranks from it on the hub's request; the ranks then dial their launcher directly.

    hub (host 0) --Preload/Fork/StackRequest/KillRanks/Heartbeat--> agent --Preload/Fork--> zygote --> ranks
                 <--Forked/Refused/Exited/Stacks/Heartbeat--------

What only this host knows is put in each rank's spec here: the agent is the process whose death ends the
ranks, their stack and output files are written in the agent's folder (what they write outside calls goes
to this host's log, as the agent's own output does), and host-local variables (SLURM_*, HOSTNAME,
TMPDIR, ...) are this host's. The agent beats every HEARTBEAT_INTERVAL_S from a thread (a zygote importing
transformers for 20 s must not look like a lost host), and gives up, killing its ranks, when host 0 has been
silent for HOST_LOST_AFTER_S or closed the connection. The connection is TLS with the cell's credentials
(harness.ranks.tls): the agent talks only to a hub that proves it is the cell's, and its ranks dial their
launcher the same way. Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness.ranks import lifecycle, stacks, tls
from harness.ranks.hostenv import for_host
from harness.ranks.output import output_paths, read_output
from harness.ranks.protocol import (
    BOOTSTRAP_TIMEOUT_S,
    HEARTBEAT_INTERVAL_S,
    HOST_LOST_AFTER_S,
    AgentHello,
    Exited,
    Fork,
    Forked,
    Heartbeat,
    KillRanks,
    OutputCapture,
    Preload,
    RankOutput,
    RankSpec,
    Refused,
    StackRequest,
    Stacks,
)
from harness.ranks.zygote import ForkRefused, Zygote

POLL_S = 0.1
DIAL_RETRY_S = 0.5
DIAL_TIMEOUT_S = 10.0  # one attempt: the TCP connect and the TLS handshake


def dial(address: tuple[str, int], credentials: Path, deadline: float) -> tls.Channel:
    """Connect to the hub, retrying while host 0's port opens; a hub that is not the cell's is refused at once."""
    context = tls.client_context(credentials)
    while True:
        try:
            return tls.dial(address, context, DIAL_TIMEOUT_S)
        except ssl.SSLCertVerificationError as error:
            raise ConnectionError(f"host 0's hub at {address[0]}:{address[1]} is not this cell's: {error}") from None
        except OSError as error:
            if time.monotonic() > deadline:
                raise ConnectionError(f"cannot reach host 0's hub at {address[0]}:{address[1]}: {error}") from None
            time.sleep(DIAL_RETRY_S)


class Agent:
    def __init__(self, host: int, connection: tls.Channel, credentials: Path, log=print):
        self.host = host
        self.connection = connection
        self.credentials = credentials  # this host's path of the cell's credentials, for its ranks
        self.log = log
        self.workdir = tempfile.mkdtemp(prefix="harness-agent-")
        self.zygote = Zygote()
        self.ranks: dict[int, int] = {}  # pid -> rank, every rank forked here
        self.reported: set[int] = set()
        self._send_lock = threading.Lock()
        self._stopped = threading.Event()

    def send(self, message: object) -> None:
        with self._send_lock:
            self.connection.send(message)

    def serve(self) -> str:
        """Until host 0 goes; why it stopped."""
        self.send(AgentHello(self.host, socket.gethostname(), os.getpid()))
        threading.Thread(target=self._beat, name="harness-agent-heartbeat", daemon=True).start()
        last_heard = time.monotonic()
        try:
            while True:
                try:
                    while self.connection.poll(POLL_S):  # everything that arrived, before judging silence
                        self._handle(self.connection.recv())
                        last_heard = time.monotonic()
                    self._report_exits()
                except (EOFError, OSError):  # a send or a receive: host 0 is gone either way
                    return "host 0 closed the connection"
                if time.monotonic() - last_heard > HOST_LOST_AFTER_S:
                    return f"host 0 silent for {time.monotonic() - last_heard:.1f}s"
        finally:
            self._stopped.set()
            self.close()

    def close(self) -> None:
        for pid in self.ranks:
            lifecycle.signal_group(pid, signal.SIGKILL)
        self.zygote.kill()
        with contextlib.suppress(OSError):
            self.connection.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _handle(self, message: object) -> None:
        if isinstance(message, Heartbeat):
            return
        if isinstance(message, Preload):
            sys.path[:] = message.sys_path
            self.zygote.preload(message.modules)
        elif isinstance(message, Fork):
            specs = [self._localize(spec) for spec in message.specs]
            try:
                pids = self.zygote.fork(specs, [], time.monotonic() + BOOTSTRAP_TIMEOUT_S)
            except ForkRefused as refused:
                self.send(Refused(str(refused), refused.bare))
                return
            self.ranks.update({pid: spec.rank for pid, spec in zip(pids, specs, strict=True)})
            self.send(Forked(pids))
        elif isinstance(message, StackRequest):
            self.send(Stacks(self._stacks(message), self._outputs(message)))
        elif isinstance(message, KillRanks):
            for pid in message.pids:
                if pid in self.ranks:  # only what this agent forked
                    lifecycle.signal_group(pid, signal.SIGKILL)

    def _localize(self, spec: RankSpec) -> RankSpec:
        # Outside calls this host's ranks write where this agent and its zygote do: the host's own log.
        capture = None if spec.launch.capture is None else OutputCapture(log=None)
        launch = dataclasses.replace(spec.launch, workdir=self.workdir, launcher_pid=os.getpid(), capture=capture)
        host_environ = dict(os.environ)
        return dataclasses.replace(spec, launch=launch, environ=for_host(spec.environ, host_environ),
                                   host_environ=host_environ, credentials=str(self.credentials))

    def _stacks(self, request: StackRequest) -> dict[int, str]:
        ranks = {rank: pid for rank, pid in request.pids.items() if self.ranks.get(pid) == rank}
        if request.signal_first:
            stacks.collect(self.workdir, ranks, clear=True)
        host = socket.gethostname()
        return {rank: stacks.read_stack(self.workdir, rank) or
                f"(no stack written on {host}: the rank did not answer SIGUSR1)" for rank in request.pids}

    def _outputs(self, request: StackRequest) -> dict[int, RankOutput]:
        """What this host's ranks wrote in their call so far, from their output files here."""
        return {rank: read_output(output_paths(self.workdir, rank)) for rank, pid in request.pids.items()
                if self.ranks.get(pid) == rank}

    def _report_exits(self) -> None:
        for pid, code in self.zygote.exits().items():
            if pid not in self.reported:
                self.reported.add(pid)
                self.send(Exited(pid, code))

    def _beat(self) -> None:
        while not self._stopped.wait(HEARTBEAT_INTERVAL_S):
            try:
                self.send(Heartbeat())
            except (OSError, ValueError):
                return


def run_agent(host: int, hub: tuple[str, int], credentials: Path, dial_timeout_s: float, log=print) -> str:
    """Serve host 0's hub until it goes; why the agent stopped."""
    connection = dial(hub, credentials, time.monotonic() + dial_timeout_s)
    log(f"agent of host {host}: connected to host 0's hub at {hub[0]}:{hub[1]}")
    return Agent(host, connection, credentials, log).serve()
