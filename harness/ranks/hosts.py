"""A cell across hosts, the launcher's side: the hub on host 0 that every other host's agent dials.

Which process runs what (H hosts x G ranks, world up to H*G):

    host 0:  harness host -> pytest (launcher: PoolLauncher + Hub) -> zygote -> ranks 0..G-1
    host h:  harness host (agent, harness.ranks.agent) -> zygote -> ranks h*G..h*G+G-1
             agent --TLS--> hub on host 0 (Preload/Fork/Stacks/Kill in, Forked/Refused/Exited out)
             every rank --TLS--> its RankSet's listener on host 0 (the one protocol: Call, Done, ...)

Every connection is TLS 1.3, both ends proving they hold the cell's credentials before any message is read
(harness.ranks.tls); the hub and the listeners bind host 0's address as the cell knows it, not every interface.

A world of W ranks uses the first ceil(W/G) hosts. Both ends send a Heartbeat every HEARTBEAT_INTERVAL_S; a
host silent for HOST_LOST_AFTER_S (or whose connection closed) is lost, and the host named is the one
that went silent first: a partitioned host stops beating before its peers' connections break. The first
loss is written to $HARNESS_HOST_CAUSE (JSON) for the engine, and every later call fails at once.

The environment (harness host sets it on host 0's pytest): HARNESS_HOSTS (H), HARNESS_HOST_RANKS (G),
HARNESS_HUB (host 0's address:port), HARNESS_HOSTS_CREDENTIALS (the path of the cell's TLS credentials, which
the engine wrote: never their content), HARNESS_HOST_CAUSE. Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pickle
import queue
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar, overload

from harness.environment import HOST_CAUSE_ENV as CAUSE_ENV
from harness.environment import HOST_RANKS_ENV, HOSTS_ENV, HUB_ENV
from harness.environment import HOSTS_CREDENTIALS_ENV as CREDENTIALS_ENV
from harness.ranks import tls
from harness.ranks.failures import HostLostError
from harness.ranks.hostenv import portable
from harness.ranks.protocol import (
    HEARTBEAT_INTERVAL_S,
    HOST_LOST_AFTER_S,
    AgentHello,
    Exited,
    Fork,
    Forked,
    Heartbeat,
    KillRanks,
    Preload,
    RankSpec,
    Refused,
    StackRequest,
    Stacks,
)

# A host silent this long (at least two beats missed) counts as silent when naming who went first.
SILENT_AFTER_S = 3 * HEARTBEAT_INTERVAL_S
AGENT_REPLY_TIMEOUT_S = 30.0
# Admission: the TLS handshake and the agent's hello, together, within this; the hello at most this large.
ADMISSION_TIMEOUT_S = 10.0
ADMISSION_MAX_BYTES = 64 * 1024
# Connections still in admission at once; more are closed at once (each holds a thread for ADMISSION_TIMEOUT_S).
MAX_ADMITTING = 32
POLL_S = 0.1
# The types of message AgentLink.request waits for.
_Reply = TypeVar("_Reply")
_Other = TypeVar("_Other")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostsConfig:
    hosts: int
    ranks_per_host: int
    hub_address: tuple[str, int]
    credentials: Path  # the cell's TLS key and certificate (harness.ranks.tls)
    cause_file: Path | None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> HostsConfig | None:
        """The cell's hosts, or None for a cell on one host (every variable unset)."""
        if environ is None:
            environ = os.environ
        try:
            if int(environ.get(HOSTS_ENV, "1") or "1") <= 1:
                return None
            address, _, port = environ[HUB_ENV].rpartition(":")
            cause = environ.get(CAUSE_ENV)
            return cls(hosts=int(environ[HOSTS_ENV]), ranks_per_host=int(environ[HOST_RANKS_ENV]),
                       hub_address=(address, int(port)), credentials=Path(environ[CREDENTIALS_ENV]),
                       cause_file=Path(cause) if cause else None)
        except (KeyError, ValueError) as error:
            raise ValueError(f"a cell across hosts needs ${HOSTS_ENV}, ${HOST_RANKS_ENV}, ${HUB_ENV} (address:port) "
                             f"and ${CREDENTIALS_ENV} (a file), as harness host sets them: {error!r}") from None


class AgentLink:
    """The hub's connection to one host's agent: what it last said and when."""

    def __init__(self, connection: tls.Channel, hello: AgentHello):
        self.connection = connection
        self.host, self.hostname, self.pid = hello.host, hello.hostname, hello.pid
        self.last_seen = time.monotonic()
        self.closed_at: float | None = None
        self.replies: queue.Queue = queue.Queue()
        self.exit_codes: dict[int, int] = {}
        self._send_lock = threading.Lock()
        threading.Thread(target=self._read, name=f"harness-hub-host{self.host}", daemon=True).start()

    def send(self, message: object) -> bool:
        try:
            with self._send_lock:
                self.connection.send(message)
            return True
        except (OSError, ValueError):
            return False

    @overload
    def request(self, message: object, expect: tuple[type[_Reply]], timeout_s: float) -> _Reply: ...
    @overload
    def request(self, message: object, expect: tuple[type[_Reply], type[_Other]], timeout_s: float
                ) -> _Reply | _Other: ...
    def request(self, message: object, expect: tuple[type, ...], timeout_s: float) -> object:
        """Send, then the next reply of one of `expect` types; HostLostError when the host goes first."""
        while not self.replies.empty():  # an answer to an earlier request that came too late
            self.replies.get_nowait()
        self.send(message)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                reply = self.replies.get(timeout=POLL_S)
            except queue.Empty:
                if self.closed_at is not None:
                    raise HostLostError(self.host, self.hostname, "its agent's connection closed") from None
                continue
            if isinstance(reply, expect):
                return reply
        raise HostLostError(self.host, self.hostname, f"its agent did not answer {type(message).__name__} "
                                                      f"within {timeout_s:g}s")

    def _read(self) -> None:
        while True:
            try:
                message = self.connection.recv()
            except (EOFError, OSError, ValueError):
                self.closed_at = time.monotonic()
                return
            except Exception:  # a message that does not unpickle: the agent is not ours to trust further
                self.closed_at = time.monotonic()
                return
            self.last_seen = time.monotonic()
            if isinstance(message, Exited):
                self.exit_codes[message.pid] = message.exit_code
            elif not isinstance(message, Heartbeat):
                self.replies.put(message)


class Hub:
    """Host 0's listener for the agents, their heartbeats, and the first host lost."""

    def __init__(self, config: HostsConfig):
        self.config = config
        self.links: dict[int, AgentLink] = {}
        self.loss: HostLostError | None = None
        self._closed = False
        self._context = tls.server_context(config.credentials)
        # Host 0's address as the cell knows it (the agents dial it), not every interface of the host.
        try:
            self._server = socket.create_server(config.hub_address, reuse_port=False)
        except OSError as error:
            raise OSError(f"host 0's hub cannot listen on {config.hub_address[0]}:{config.hub_address[1]}, host 0's "
                          f"address as the cell resolves its name: {error}") from None
        self._server.settimeout(POLL_S)
        self._admitting = threading.BoundedSemaphore(MAX_ADMITTING)
        self._arrived = threading.Condition()
        for target, name in ((self._accept, "accept"), (self._beat, "heartbeat"), (self._watch, "watch")):
            threading.Thread(target=target, name=f"harness-hub-{name}", daemon=True).start()

    @property
    def master_addr(self) -> str:
        return self.config.hub_address[0]

    def hosts_for(self, world_size: int) -> int:
        return math.ceil(world_size / self.config.ranks_per_host)

    def wait_agents(self, hosts: int, deadline: float) -> None:
        """Until hosts 1..hosts-1 have dialled in (they retry while names and ports come up)."""
        with self._arrived:
            while not all(host in self.links for host in range(1, hosts)):
                self.raise_if_lost()
                if time.monotonic() > deadline:
                    missing = [host for host in range(1, hosts) if host not in self.links]
                    address = f"{self.config.hub_address[0]}:{self.config.hub_address[1]}"
                    raise HostLostError(missing[0], "?", f"never dialled host 0's hub at {address} "
                                                         f"(hosts {missing} missing)")
                self._arrived.wait(POLL_S)

    def fork(self, host: int, specs: list[RankSpec], modules: list[str], sys_path: list[str],
             deadline: float) -> list[int]:
        """Fork `specs` on `host` through its agent; their pids there. Only the portable environment goes."""
        link = self.links[host]
        link.send(Preload(modules, sys_path))
        sent = [dataclasses.replace(spec, environ=portable(spec.environ)) for spec in specs]
        reply = link.request(Fork(sent), (Forked, Refused), max(1.0, deadline - time.monotonic()))
        if isinstance(reply, Refused):
            raise RuntimeError(f"host {host} ({link.hostname}) cannot fork ranks: {reply.reason}")
        return reply.pids

    def stacks(self, host: int, pids: dict[int, int], signal_first: bool) -> Stacks:
        """The Python stacks of ranks on `host` (rank -> pid there), and what they wrote in their call."""
        link = self.links.get(host)
        if link is None or link.closed_at is not None:
            return Stacks({rank: f"(host {host} is gone: no stack)" for rank in pids})
        try:
            return link.request(StackRequest(pids, signal_first), (Stacks,), AGENT_REPLY_TIMEOUT_S)
        except HostLostError as lost:
            return Stacks({rank: f"({lost})" for rank in pids})

    def kill(self, host: int, pids: list[int]) -> None:
        link = self.links.get(host)
        if link is not None:
            link.send(KillRanks(pids))

    def exit_code(self, host: int, pid: int, wait_s: float) -> int | None:
        link = self.links.get(host)
        end = time.monotonic() + wait_s
        while link is not None and pid not in link.exit_codes and time.monotonic() < end:
            time.sleep(POLL_S / 2)
        return link.exit_codes.get(pid) if link is not None else None

    def raise_if_lost(self) -> None:
        if self.loss is not None:
            raise self.loss

    def close(self) -> None:
        self._closed = True
        for link in self.links.values():
            link.connection.close()
        self._server.close()

    # ------------------------------------------------------------ threads

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._admitting.acquire(blocking=False):  # a flood of connections: each waits its turn no more
                sock.close()
                continue
            threading.Thread(target=self._admit, args=(sock,), daemon=True).start()

    def _admit(self, sock: socket.socket) -> None:
        """Mutual TLS, then one small AgentHello, all within ADMISSION_TIMEOUT_S: nothing is read from a peer that
        has not proven it holds the cell's key, and a silent or trickling one costs only this thread, briefly."""
        try:
            deadline = time.monotonic() + ADMISSION_TIMEOUT_S
            connection = tls.accept(sock, self._context, deadline)
            if connection is None:
                return
            try:
                hello = pickle.loads(connection.recv_bytes(ADMISSION_MAX_BYTES, deadline))
                if not isinstance(hello, AgentHello) or not 0 < hello.host < self.config.hosts:
                    raise ValueError(f"not an agent's hello: {type(hello).__name__}")
            except Exception:  # EOF, a timeout, a message too large, one that is no hello
                connection.close()
                return
        finally:
            self._admitting.release()
        with self._arrived:
            self.links[hello.host] = AgentLink(connection, hello)
            self._arrived.notify_all()

    def _beat(self) -> None:
        while not self._closed:
            for link in list(self.links.values()):
                link.send(Heartbeat())
            time.sleep(HEARTBEAT_INTERVAL_S)

    def _watch(self) -> None:
        while not self._closed and self.loss is None:
            time.sleep(POLL_S)
            loss = first_lost(list(self.links.values()), time.monotonic())
            if loss is not None and not self._closed:  # closing the links ourselves loses no host
                self.loss = loss
                write_cause(self.config.cause_file, loss)


def first_lost(links: list[AgentLink], now: float) -> HostLostError | None:
    """None while every host beats. Once one closed its connection or was silent HOST_LOST_AFTER_S: the host
    that went silent first among those silent for SILENT_AFTER_S or closed (a partitioned host stops beating
    before the hosts whose collectives it breaks close their connections)."""
    if not any(link.closed_at is not None or now - link.last_seen > HOST_LOST_AFTER_S for link in links):
        return None
    suspects = [link for link in links if link.closed_at is not None or now - link.last_seen > SILENT_AFTER_S]
    first = min(suspects, key=lambda link: link.last_seen)
    silent_s = now - first.last_seen
    if first.closed_at is not None and first.closed_at - first.last_seen < SILENT_AFTER_S:
        reason = "its agent's connection closed (the agent or its host was killed)"
    else:
        reason = f"no heartbeat for {silent_s:.1f}s (a partition, or a host that froze)"
    return HostLostError(first.host, first.hostname, reason)


def write_cause(path: Path | None, loss: HostLostError) -> None:
    """The engine reads this after the job: the errored folder names the host."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        path.write_text(json.dumps({"host": loss.host, "hostname": loss.hostname, "reason": loss.reason,
                                    "at": time.time()}) + "\n")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a RankSet's ranks live: ranks [h*G, (h+1)*G) on host h; host 0's are this launcher's."""

    hub: Hub
    world_size: int

    @property
    def ranks_per_host(self) -> int:
        return self.hub.config.ranks_per_host

    @property
    def master_addr(self) -> str:
        return self.hub.master_addr

    @property
    def credentials(self) -> Path:
        return self.hub.config.credentials

    def host_of(self, rank: int) -> int:
        return rank // self.ranks_per_host

    def remote_ranks(self) -> dict[int, list[int]]:
        """host -> its ranks, for every host but 0."""
        by_host: dict[int, list[int]] = {}
        for rank in range(self.world_size):
            if self.host_of(rank):
                by_host.setdefault(self.host_of(rank), []).append(rank)
        return by_host

    def environ(self) -> dict[str, str]:
        """What a call sends: only what is not host 0's own (no SLURM_*, HOSTNAME, TMPDIR, ...); ranks on
        host 0 keep theirs, every other host adds its own (hostenv.for_host)."""
        return portable(dict(os.environ))
