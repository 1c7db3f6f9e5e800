"""What a rank does: join the process group once, then serve calls until the launcher goes away.

The loop, in the rank process (spawned by the launcher, or forked by the zygote):

    connect to the launcher's socket, send Hello(rank)
    init_process_group (rendezvous_store)      -> Ready (or Failed, then exit)
    loop: Ping  -> Pong                         (alive and idle: the launcher asks before every call)
          Call  -> Done | Failed                (then put back what the call changed; stay alive)
          Audit -> Pong                         (a test ended: put back what it left, name the rest)
          Probe -> Pong | Failed, then exit     (one collective on the world group after a failed call)

A call's output (fds 1 and 2) is captured into its Done or Failed (harness.ranks.output); between calls the
rank writes to the session's rank log. A rank that raised stays alive: when every rank answered and a probe
collective succeeds, the launcher keeps the pool. The world group lives as long as the rank, and so do the
process groups of the meshes that DTensor's caches keep: those caches stay warm across calls and tests (a
family's later cases skip its sharding propagation), and a later call's equal mesh, handed back by a cache, names
groups that are alive. A call's other groups are destroyed after it. After a failed call the caches are cleared
and every group but the world's is destroyed (one a failure left half-used is never handed to the next call);
past KEPT_GROUPS_MAX the caches are cleared too, so groups (and their threads) stay bounded.
Needs torch in the rank only (imported inside functions).
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import functools
import gc
import multiprocessing.connection
import os
import pickle
import random
import signal
import socket
import sys
import sysconfig
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from harness.ranks import handover, lifecycle, tls
from harness.ranks.boundary import BoundaryState
from harness.ranks.hostenv import for_host
from harness.ranks.output import CallCapture, flush_streams
from harness.ranks.protocol import (
    MIB,
    Audit,
    Call,
    Done,
    Failed,
    Hello,
    Launch,
    Ping,
    Pong,
    Probe,
    RankSpec,
    Ready,
)
from harness.ranks.state import FreshState, SuiteSnapshot
from harness.ranks.survivors import Survivors

# Process groups a rank keeps for warm caches' meshes before it clears them (each gloo group holds threads).
KEPT_GROUPS_MAX = 32


def stack_path(workdir: str | Path, rank: int) -> Path:
    """Where faulthandler writes the rank's stack (on SIGUSR1, or when it crashes)."""
    return Path(workdir) / f"stack.rank{rank}.txt"


def store_path(workdir: str | Path) -> Path:
    """The FileStore the ranks of one host meet through, in the launcher's work folder (mode 0700)."""
    return Path(workdir) / "rendezvous.store"


def spawned_rank_main(spec: RankSpec) -> None:
    """Entry point of a rank spawned by the launcher itself (its OS parent)."""
    lifecycle.die_with_parent(spec.launch.launcher_pid)
    serve(spec)


def serve(spec: RankSpec) -> None:
    launch, rank = spec.launch, spec.rank
    lifecycle.own_process_group()
    apply_environment(spec.environ)
    capture = None if launch.capture is None else CallCapture(launch.capture.log, launch.workdir, rank)
    stack_file = open(stack_path(launch.workdir, rank), "a")  # noqa: SIM115 - open until the rank exits
    faulthandler.enable(file=stack_file, all_threads=True)  # a crash leaves its stack here
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    lifecycle.watch_launcher(launch.launcher_pid)
    # Set here, the rank's variables (RANK, MASTER_ADDR, ...) show in rank_environ: every call gets them back.
    before = dict(os.environ)
    set_environment(launch, rank)
    handover.adopt(launch.handover_dir)
    rank_environ = {name: value for name, value in os.environ.items() if before.get(name) != value}

    # The process group forms before the launcher is dialled: a pool started ahead of its test (harness.ranks.pool)
    # is ready by the time the launcher, busy with the test before, accepts its ranks.
    try:
        state, failure = RankState(launch, rank), None
    except BaseException as error:
        state, failure = None, Failed.from_exception(error, alive=False)
    connection = connect(spec)
    _send(connection, Hello(rank))
    if failure is not None:
        _fail_and_exit(connection, failure)
    assert state is not None  # set whenever failure is not: a rank whose state failed exited above
    _send(connection, Ready())
    unfit: list[str] = []  # why this rank is not as a fresh one after its last call
    while True:
        try:
            message = pickle.loads(connection.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)  # the launcher closed the pool
        if isinstance(message, Ping):
            _send(connection, Pong(unfit))
        elif isinstance(message, Audit):
            unfit = unfit or state.audit()
            _send(connection, Pong(unfit))
        elif isinstance(message, Probe):
            try:
                state.probe()
            except BaseException as error:
                _fail_and_exit(connection, Failed.from_exception(error, alive=False))
            _send(connection, Pong(unfit))
        elif isinstance(message, Call):
            sys.path[:] = message.sys_path
            environ = message.environ if spec.host_environ is None else for_host(message.environ, spec.host_environ)
            apply_environment({**environ, **rank_environ})
            connection.send_bytes(_outcome(state, message.payload, capture))
            try:
                unfit = state.reset()  # after replying: the launcher moves on while this rank cleans up
                apply_environment({**message.environ, **rank_environ})
            except BaseException as error:
                # Too late to fail the call; the next Ping finds this rank gone and the pool is replaced.
                print(f"rank {rank} cannot serve another call: {error!r}", file=sys.stderr, flush=True)
                os._exit(1)


def connect(spec: RankSpec) -> multiprocessing.connection.Connection | tls.Channel:
    """The connection to the launcher: its Unix socket and challenge on one host; across hosts, TLS with the cell's
    credentials to its listener on host 0 (harness.ranks.tls)."""
    if spec.credentials is None:
        return multiprocessing.connection.Client(spec.address, authkey=spec.authkey)
    address = (spec.address[0], int(spec.address[1]))
    # No deadline: the launcher handshakes once every host has forked its ranks, which may wait for a zygote's
    # imports; a rank whose launcher is gone dies with it (lifecycle.watch_launcher).
    return tls.dial(address, tls.client_context(spec.credentials), None)


def call_fn(fn: Callable[..., Any], args: tuple) -> Any:
    """The test's function on this rank: its frame is where a failure's traceback starts (`called_traceback`)."""
    return fn(*args)


def called_traceback(error: BaseException) -> str:
    """`error`'s traceback from the test's function on: harness's frames above it (`_outcome`, `RankState.call`)
    lead no rank's failure. An error of harness itself, raised before the function ran or around it, keeps its
    whole traceback."""
    frame = error.__traceback__
    while frame is not None and frame.tb_frame.f_code is not call_fn.__code__:
        frame = frame.tb_next
    if frame is None or frame.tb_next is None:
        return traceback.format_exc()
    return "".join(traceback.format_exception(type(error), error, frame.tb_next))


def _outcome(state: RankState, payload: bytes, capture: CallCapture | None) -> bytes:
    """The call's Done or Failed, pickled, with what the rank wrote while it ran (its fds put back first)."""
    if capture is not None:
        capture.start()
    started = time.perf_counter()
    outcome: Done | Failed
    try:
        outcome = state.call(payload)
    except BaseException as error:
        outcome = Failed.from_exception(error, traceback_text=called_traceback(error),
                                        seconds=time.perf_counter() - started, modules=state.imported())
    if capture is not None:
        outcome = dataclasses.replace(outcome, output=capture.stop())
    else:
        flush_streams()  # not captured (pytest -s): the call's output, C's buffer too, is out before its result
    try:
        return pickle.dumps(outcome)
    except BaseException as error:  # a value that does not pickle is this rank's failure
        return pickle.dumps(Failed.from_exception(error, seconds=outcome.seconds, modules=outcome.modules,
                                                  output=outcome.output))


def _send(connection: multiprocessing.connection.Connection | tls.Channel, message: object) -> None:
    connection.send_bytes(pickle.dumps(message))


def _fail_and_exit(connection: multiprocessing.connection.Connection | tls.Channel, failure: Failed) -> NoReturn:
    """Report, then exit at once: interpreter teardown could wait on a collective a peer never joins."""
    with contextlib.suppress(OSError):
        _send(connection, failure)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def apply_environment(environ: dict[str, str]) -> None:
    """Make os.environ equal `environ`, touching only what differs (other threads may read it)."""
    for name in [name for name in os.environ if name not in environ]:
        del os.environ[name]
    for name, value in environ.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def local_rank(launch: Launch, rank: int) -> int:
    """The rank's index on its host: its GPU there."""
    return rank % launch.local_world_size


def set_environment(launch: Launch, rank: int) -> None:
    os.environ.update({
        "MASTER_ADDR": launch.master_addr,
        "MASTER_PORT": str(launch.port),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank(launch, rank)),
        "WORLD_SIZE": str(launch.world_size),
        "LOCAL_WORLD_SIZE": str(launch.local_world_size),
    })
    # Every rank is on this host: keep gloo on the loopback device, whatever the host name resolves to.
    # Across hosts loopback would refuse every peer (connectFullMesh ... Connection refused).
    if launch.single_host and "GLOO_SOCKET_IFNAME" not in os.environ and \
            any(name == "lo" for _, name in socket.if_nameindex()):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    # Share this host's cores between its ranks instead of each rank starting a thread per core.
    threads = max(1, (os.cpu_count() or 1) // launch.local_world_size)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def init_process_group(launch: Launch, rank: int) -> bool:
    """Select this rank's GPU and join the process group; True for CUDA and NCCL, False for gloo on CPU."""
    import torch
    import torch.distributed as dist

    use_cuda = launch.device == "cuda" or (launch.device == "auto" and torch.cuda.is_available())
    device_index = local_rank(launch, rank)
    if use_cuda:
        if device_index >= torch.cuda.device_count():
            raise RuntimeError(f"rank {rank} needs GPU {device_index}, but {torch.cuda.device_count()} are visible")
        torch.cuda.set_device(device_index)
    # A rank forked with torch already imported missed OMP_NUM_THREADS: its thread count is set here.
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    timeout = timedelta(seconds=launch.collective_timeout_s)
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo",
        store=rendezvous_store(launch, rank, timeout),
        rank=rank,
        world_size=launch.world_size,
        timeout=timeout,
        device_id=torch.device("cuda", device_index) if use_cuda else None,
    )
    return use_cuda


def rendezvous_store(launch: Launch, rank: int, timeout: timedelta):
    """Where the ranks meet. On one host: a FileStore in the launcher's work folder (0700), which no other user
    can open and no port exposes (a TCPStore listens on every interface: any local user could write to it).
    Across hosts: rank 0's TCPStore, listening on host 0's address in the cell alone, not on every interface."""
    import torch.distributed as dist

    if launch.single_host:
        return dist.FileStore(str(store_path(launch.workdir)), launch.world_size)
    if rank != 0:
        return dist.TCPStore(launch.master_addr, launch.port, launch.world_size, False, timeout)
    # Bound here: given only a port, the store would listen on every interface.
    family = socket.AF_INET6 if ":" in launch.master_addr else socket.AF_INET
    listener = socket.create_server((launch.master_addr, launch.port), family=family)
    return dist.TCPStore(launch.master_addr, launch.port, launch.world_size, True, timeout,
                         master_listen_fd=listener.detach())


class RankState:
    """A rank's process group and everything it puts back after each call."""

    def __init__(self, launch: Launch, rank: int):
        self.use_cuda = init_process_group(launch, rank)
        self.world_size = launch.world_size
        self.cuda_device = local_rank(launch, rank)  # the GPU this rank selected, when it uses CUDA
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.groups = set(self._process_groups())
        self.groups_before_call = set(self.groups)
        self.rng = self._rng_state()
        self.suite = SuiteSnapshot(())
        _installed_roots()
        self.modules = set(sys.modules)
        self.fresh = FreshState(torch)  # after every import and setting the rank makes itself
        self.boundary = BoundaryState(torch)  # what a test may leave for the next one (audit)
        self.audited = True  # no call since the last audit (or the start): the boundary state is as fresh
        self.survivors = Survivors()
        self.survivors.freeze()  # collections between calls skip what exists now

    def call(self, payload: bytes) -> Done:
        torch = self.torch
        fn, args = pickle.loads(payload)
        self.boundary.accept_imports(self.fresh.accept_imports(), first_since_audit=self.audited)
        self.audited = False
        self.suite = SuiteSnapshot(_suite_modules(fn))
        self.groups_before_call = set(self._process_groups())
        if self.use_cuda:
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        with warnings.catch_warnings():
            value = call_fn(fn, args)
        peak_allocated = peak_reserved = None
        if self.use_cuda:
            torch.cuda.synchronize()  # the call's GPU work is part of its time, and must be done
            peak_allocated = torch.cuda.max_memory_allocated() / MIB
            peak_reserved = torch.cuda.max_memory_reserved() / MIB
        return Done(value=value, seconds=time.perf_counter() - started, peak_allocated_mib=peak_allocated,
                    peak_reserved_mib=peak_reserved, modules=self.imported())

    def probe(self) -> None:
        """After a failed call: forget its meshes and groups, then one all_reduce on the world group: every rank
        still agrees on it. A group that a mesh kept elsewhere still names fails the probe (the set is replaced)."""
        torch = self.torch
        self._forget_meshes()
        if kept := [group for group in self._process_groups() if group not in self.groups]:
            raise RuntimeError(f"{len(kept)} process groups of a failed call are still named by a live mesh")
        ones = torch.ones(1, device=f"cuda:{self.cuda_device}" if self.use_cuda else "cpu")
        self.dist.all_reduce(ones)
        if int(ones.item()) != self.world_size:
            raise RuntimeError(f"the probe all_reduce summed to {ones.item()}, not {self.world_size}")

    def audit(self) -> list[str]:
        """After a test's last call: put back what it left for the next test; what could not be, in words."""
        unfit = self.boundary.settle()
        self.audited = not unfit
        return unfit

    def imported(self) -> list[str]:
        """Modules imported since the last time this was asked (the launcher has the zygote import them)."""
        imported = [name for name in sys.modules if name not in self.modules and not name.startswith("__")]
        self.modules.update(imported)
        return imported

    def reset(self) -> list[str]:
        """Put back what a call may have changed, then free what it left; what could not be put back, in
        words (empty: this rank is as a fresh one would be)."""
        torch = self.torch
        if not self.dist.is_initialized():
            raise RuntimeError("the call destroyed the default process group")
        self.suite.restore()
        self.suite = SuiteSnapshot(())
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()
        gc.collect()  # frees what the call left, meshes included (they form cycles): their groups can go
        if len(self._process_groups()) > KEPT_GROUPS_MAX or self._destroyed_a_group():
            self._forget_meshes()  # bounded; and a cached mesh never hands a later call a group the call destroyed
        else:
            self._drop_call_groups()
        self.survivors.freeze()  # the next reset's collection walks only what the next call makes
        self._set_rng_state(self.rng)
        if self.use_cuda:
            torch.cuda.set_device(self.cuda_device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        return self.fresh.settle()

    def _forget_meshes(self) -> None:
        """Clear the caches that hold meshes, free them, and destroy the groups no live mesh names. Where a mesh
        still names one, every object is made collectable again and collected: a reference cycle through something
        frozen at an earlier reset may be what holds it (a whole collection, so only then)."""
        _clear_mesh_caches()
        gc.collect()
        self._drop_call_groups()
        if any(group not in self.groups for group in self._process_groups()):
            self.survivors.thaw()
            gc.collect()
            self._drop_call_groups()
        self.survivors.freeze()

    def _drop_call_groups(self) -> None:
        """Destroy the process groups the call created, once its meshes and the caches known to hold them are
        gone (reset clears and collects first). The world group stays: c10d's name registry and the meshes of
        later calls then agree on every group that exists.

        A group that a surviving DeviceMesh still names is kept instead: some cache we do not know of
        (torch's, transformers', the suite's) may hand that mesh to a later call, which must then resolve
        its groups. Holding a few groups (an NCCL communicator each) costs less than a false red, and it
        is bounded: a kept group goes at the first reset after its last mesh is gone."""
        call_groups = [group for group in self._process_groups() if group not in self.groups]
        if not call_groups:
            return
        named = self.survivors.named_groups()
        for group in call_groups:
            if group.group_name not in named:
                self.dist.destroy_process_group(group)

    def _destroyed_a_group(self) -> bool:
        """The call destroyed a group that existed before it (one a warm cache's mesh may name). Asked of the
        group registry, not by scanning the heap for meshes: that scan costs a call on a large process."""
        return not self.groups_before_call <= set(self._process_groups())

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


def _clear_mesh_caches() -> None:
    """DeviceMesh's registry of meshes, and DTensor's sharding caches: they are keyed by meshes that compare
    equal across calls (same ranks and names) while naming process groups the last call destroyed."""
    resources = getattr(sys.modules.get("torch.distributed.device_mesh"), "_mesh_resources", None)
    for value in vars(resources).values() if resources is not None else ():
        if isinstance(value, (dict, list, set)):
            value.clear()
    dtensor = getattr(sys.modules.get("torch.distributed.tensor._api"), "DTensor", None)
    if dtensor is None:
        return
    propagator = getattr(getattr(dtensor, "_op_dispatcher", None), "sharding_propagator", None)
    for cached in ("propagate_op_sharding", "_propagate_tensor_meta_cached"):
        clear = getattr(getattr(propagator, cached, None), "cache_clear", None)
        if clear is not None:
            clear()
    # The C++ dispatch fast path keeps its own cache of output shardings, whose specs hold the mesh of the
    # call that first ran the op: a later call's DTensor op returned that mesh, naming destroyed groups.
    clear_fast_path = getattr(sys.modules["torch"]._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_fast_path is not None:
        clear_fast_path()
    # Redistribution plans and collective cost estimates, kept per mesh: they would keep old meshes alive.
    redistribute = sys.modules.get("torch.distributed.tensor._redistribute")
    # A cached planner holds itself through its cost closure: out of the cache it is a reference cycle, and one
    # that lived through a reset is frozen (harness.ranks.survivors), so only a whole-heap collection (0.4-1.7 s
    # a rank on 2 loaded cores) would free it and its mesh. Emptied, it lets go of the mesh at once.
    planners = getattr(redistribute, "_planner_cache", None)
    for planner in list(planners.values()) if isinstance(planners, dict) else ():
        vars(planner).clear()
    topology = getattr(sys.modules.get("torch.distributed.tensor._collective_utils"), "MeshTopoInfo", None)
    for clear in (
        getattr(redistribute, "clear_redistribute_planner_cache", None),
        getattr(getattr(redistribute, "_gen_transform_infos", None), "cache_clear", None),
        getattr(getattr(topology, "build_from_mesh", None), "cache_clear", None),
    ):
        if clear is not None:
            clear()


@functools.cache
def _installed_roots() -> frozenset[str]:
    """Where installed packages and the stdlib live. Cached, and first asked before the rank's fresh state is
    taken: sysconfig imports its data module on first use."""
    roots = {os.path.abspath(p) for p in sysconfig.get_paths().values()}
    return frozenset(roots | {sys.prefix, sys.base_prefix})


def _suite_modules(fn: Callable[..., Any]) -> Iterable[Any]:
    """The loaded modules beside `fn`'s own (the test suite's code), not installed packages or the stdlib."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if not path:
        return []
    folder = os.path.dirname(os.path.abspath(path))
    installed = _installed_roots()
    if any(folder == root or folder.startswith(root + os.sep) for root in installed):
        return []
    return [loaded for loaded in list(sys.modules.values())
            if isinstance(file := getattr(loaded, "__file__", None), str)
            and os.path.abspath(file).startswith(folder + os.sep)]
