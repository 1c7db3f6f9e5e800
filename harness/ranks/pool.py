"""Rank pools: one `RankSet` per (world size, device), forked from a template, so a test pays for its own work and
not for starting interpreters, importing torch and transformers, forming process groups or warming DTensor's
caches. Under pytest (harness.ranks.plugin) a rank set serves test after test, its process groups and caches
with it, while it is as a fresh one: `renew()` after each test audits the pools the test used (harness.ranks.boundary:
torch's and transformers' classes and module containers, hooks, modes, settings, rlimits, affinity, loggers,
config), puts back what it can and retires a set that keeps anything else; its successor is forked afresh from
the zygote, which imports modules but never runs a test's code, initialises a device or joins a process group.

`PoolLauncher()(world_size, fn, *args, timeout=..., device=...)` has the contract of
`spawn.run_distributed`: one `RankResult` per rank, or `RankFailedError` / `RankTimeoutError`.

- Within a test, calls share its ranks. After each call a rank puts back what it can of a fresh rank's state
  and names the rest (harness.ranks.state); a set that cannot be put back is replaced before the test's next
  call, and the test's report says why.
- Before every call each rank is asked whether it is alive and idle; a pool with a dead rank is replaced
  before the call is sent, so a rank that died between calls (killed, OOM) never fails the next test.
- After a call that failed on some ranks but was answered by all, a probe collective decides: the pool is
  kept when it succeeds. A rank that died, a hang, or an interrupt (pytest-timeout, Ctrl-C) replaces it.
- Ranks are forked from the zygote (harness.ranks.zygote), which imports torch, the modules of the
  functions called and the modules the ranks went on to import: of those, installed code only (the stdlib and
  installed distributions, harness.ranks.preload), so what a test wrote never runs in the template; `summary()`
  names what was left out. A zygote whose imports make forking unsafe, or rebind what verdicts rest on
  (harness.ranks.fingerprint), is replaced by one importing less (the functions' modules, then torch alone); if
  even that is refused, or the first forked pool cannot start where a spawned one can, ranks are spawned for
  the rest of the session; `summary()` says why.
- What ranks hand on to later tests' ranks on purpose goes through `store_dir`, a 0700 folder of the session
  (harness.ranks.handover), never through a process.

`HARNESS_RANKS_TIMING=PATH` appends one JSON line per call: how long `fn` ran on each rank and the call's
wall time (tests/benchmarks/bench_pool.py reads it). Needs only the standard library here.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable
from typing import Any

from harness.environment import RANKS_TIMING_ENV as TIMING_ENV
from harness.ranks import handover
from harness.ranks.failures import DistributedError, RankFailedError, RankTimeoutError, hidden_from_a_failure
from harness.ranks.hosts import HostsConfig, Hub, Placement
from harness.ranks.launcher import RankSet, pickle_call, to_results
from harness.ranks.preload import words
from harness.ranks.protocol import (
    BOOTSTRAP_TIMEOUT_S,
    COLLECTIVE_TIMEOUT_MARGIN_S,
    DEFAULT_TIMEOUT_S,
    OutputCapture,
    RankResult,
    collective_timeout,
)
from harness.ranks.zygote import ForkRefused, Zygote


class PoolLauncher:
    """`run_distributed` on persistent pools: `launcher(world_size, fn, *args, timeout=..., device=...)`."""

    def __init__(self, *, fork: bool = True, capture: OutputCapture | None = None):
        self.fork = fork
        self.capture = capture  # each call's output in its results; outside calls to capture.log
        self.preload_refused: str | None = None  # why the zygote imports less than it could
        self.fork_refused: str | None = None  # why ranks are spawned: the zygote could not fork even bare
        self.not_preloaded: dict[str, None] = {}  # modules the zygotes left out, as no installed code
        self._fork_proven = False  # a forked pool has formed its process group this session
        self.calls = 0
        self.pools_started = 0
        self.pools_replaced = 0  # killed after a death, a hang or a broken failure
        self.pools_retired = 0  # a call left state a fresh rank would not have (harness.ranks.state)
        self.pools_kept = 0  # times a pool served on after a test that used it: nothing was left behind
        self.pools_ended = 0  # GPU pools ended with their test (renew says why)
        self.pools_crashed = 0  # a rank of a set that had served earlier calls exited without a word (called again)
        self.pools_started_ahead = 0  # of pools_started: forked by renew() for the next test
        self.retirements: list[str] = []  # "pool replaced after TEST: why", not yet handed to a report
        self.retired_log: list[str] = []  # every retirement of the session, for the terminal summary
        self._last_test: dict[tuple[int, str], str] = {}  # the test whose call each pool ran last
        self._pools: dict[tuple[int, str], RankSet] = {}
        self._served: dict[tuple[int, str], int] = {}  # calls each pool has taken since it started
        self._used: set[tuple[int, str]] = set()  # pools a call used since the last renew()
        self._cuda_pools: set[tuple[int, str]] = set()  # pools whose ranks run on GPUs (they end with each test)
        self._ahead: set[tuple[int, str]] = set()  # pools started by renew() whose ranks have not yet said Ready
        self._timeouts: dict[tuple[int, str], float] = {}  # the longest call timeout seen per pool: a pool started
        # ahead waits that long in its collectives, so that no later call finds it too short
        self._handover_dir: str | None = None  # made at the first pool on this host (harness.ranks.handover)
        self._zygote: Zygote | None = None
        self._retired: list[Zygote] = []  # refused zygotes, kept while the ranks they forked serve
        # What the zygote imports besides torch: the modules of the functions called, and (from level 2) the
        # modules the ranks imported while they ran (transformers loads most of itself lazily), so a fresh
        # pool imports nothing again. A level that makes forking unsafe is given up for the one below.
        self._preload_level = 2
        self._fn_modules: list[str] = []
        self._rank_modules: dict[str, None] = {}
        # A cell across hosts (harness host set the environment): ranks beyond host 0's are forked by the
        # other hosts' agents, which dial the hub (harness.ranks.hosts).
        self._hosts = HostsConfig.from_environment()
        self._hub: Hub | None = None
        if self._hosts is not None and not fork:
            raise ValueError("a cell across hosts forks its ranks from each host's zygote; the spawned pool "
                             "cannot place ranks on other hosts")
        atexit.register(self.close)

    def __call__(self, world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = DEFAULT_TIMEOUT_S,
                 device: str = "auto") -> list[RankResult]:
        __tracebackhide__ = hidden_from_a_failure
        payload = pickle_call(world_size, fn, args, device, caller="the rank pool")
        self.calls += 1
        module = getattr(fn, "__module__", None)
        if module and module != "__main__" and module not in self._fn_modules:
            self._fn_modules.append(module)

        started = time.monotonic()
        key = (world_size, device)
        self._last_test[key] = current_test()
        self._used.add(key)
        self._timeouts[key] = max(timeout, self._timeouts.get(key, 0.0))
        pool_start_s = 0.0
        outcome, work = "failed", []
        try:
            pool = self._pools.get(key)
            starting = pool is None or key in self._ahead  # what the call waits for counts as the pool's start
            if pool is not None and not self._serves(key, pool, timeout):
                self._discard(key)
                pool, starting = None, True
            if pool is None:
                pool = self._start_pool(world_size, device, timeout)
            if starting:
                pool_start_s = max(time.monotonic() - started, 1e-6)
            served, self._served[key] = self._served.get(key, 0), self._served.get(key, 0) + 1
            try:
                replies = pool.call(payload, timeout)
            except RankFailedError as error:
                if not (error.exited and served):
                    raise
                replies = self._again_on_fresh_ranks(key, error, served, payload, timeout)
            except BaseException as error:
                if not isinstance(error, DistributedError):  # pytest-timeout, Ctrl-C: what were the ranks doing?
                    _print_stacks(pool, error)
                raise
            work = [reply.seconds for reply in replies]
            if any(reply.peak_allocated_mib is not None for reply in replies):  # only CUDA ranks measure it
                self._cuda_pools.add(key)
            outcome = "passed"
            self._preload([name for reply in replies for name in reply.modules])
            return to_results(replies)
        except RankFailedError as error:
            work = error.rank_seconds
            self._preload(error.rank_modules)
            if not (key in self._pools and self._pools[key].probe()):
                self._discard(key)
            raise
        except BaseException as error:  # a hang, or pytest-timeout / Ctrl-C while we waited
            outcome = "timeout" if isinstance(error, RankTimeoutError) else outcome
            work = getattr(error, "rank_seconds", work)
            self._discard(key)
            raise
        finally:
            _record_timing(world_size, device, fn, outcome, work, time.monotonic() - started, pool_start_s)

    def _again_on_fresh_ranks(self, key: tuple[int, str], error: RankFailedError, served: int, payload: bytes,
                              timeout: float) -> list:
        """A rank of a set that had served earlier calls exited without a word (a signal, an exit code) in this one.
        Whether the call or the set's past killed it cannot be told there, and a verdict must not depend on the
        calls before: the set is retired and the call runs again on fresh ranks, as --no-ranks-pool would run it;
        their outcome, passed or failed, is the call's. The crash is named in the test's report (POOL_REPLACED)."""
        world_size, device = key
        self._discard(key)
        line = (f"pool replaced in {current_test() or 'a call'}: rank {error.rank} {error.summary} on a rank set that "
                f"had served {served} earlier calls; the call ran again on fresh ranks, whose outcome is the test's")
        self.pools_crashed += 1
        self.retirements.append(line)
        self.retired_log.append(line)
        pool = self._start_pool(world_size, device, timeout)
        self._served[key] = 1
        return pool.call(payload, timeout)

    def renew(self) -> list[str]:
        """After each test (the plugin asks): audit every pool a call used since the last renew. A pool whose
        ranks put back what the test left (harness.ranks.boundary) serves the next test, process groups, meshes
        and warm caches included; one that cannot is retired and its successor forked at once, to form its
        process group while the next test sets up. Why a pool was replaced, since the last time this was asked
        (the plugin puts it in the test's report)."""
        for key in sorted(self._used):
            pool = self._pools.get(key)
            if pool is not None and key in self._cuda_pools:
                # Ranks on GPUs end with their test, as before ranks were kept: on one H100 the one-device tier's
                # kept ranks were retired after every test for a reason not yet captured, and waiting for their
                # reset and audit made the tier slower (11 cases in 110 s against 15: docs/measurements/
                # 2026-12-06-kept-ranks.md). Fresh ranks are the stricter isolation; GPU pools are to be kept once
                # that reason is known and put back or named.
                self._pools.pop(key).kill()
                self.pools_ended += 1
            elif pool is not None and key not in self._ahead and pool.audit():
                self.pools_kept += 1
                continue
            elif pool is not None:
                self._discard(key)
            self._start_ahead(key)
        self._used.clear()
        retirements, self.retirements = self.retirements, []
        return retirements

    def _start_ahead(self, key: tuple[int, str]) -> None:
        """Fork a pool's ranks now and wait for them at its first call. Only where forking has proven itself on
        this host: the first start, the spawn fallback and ranks on other hosts keep the plain path."""
        if not (self._fork_proven and self._hosts is None and not self.fork_refused):
            return
        world_size, device = key
        pool = self._new_pool(world_size, device, self._timeouts.get(key, DEFAULT_TIMEOUT_S))
        try:
            if self._fork_ranks(pool):
                self._ahead.add(key)
                self.pools_started_ahead += 1
                return
        except Exception:  # the zygote failed mid-fork: the next call starts its pool, and says why
            pass
        self._pools.pop(key, None)
        pool.kill()
        self.pools_started -= 1  # never started: the call will

    def _serves(self, key: tuple[int, str], pool: RankSet, timeout: float) -> bool:
        """The pool may take a call with `timeout`: its collectives wait long enough, and its ranks are ready and
        as fresh ones (asked, for a pool that served before)."""
        if timeout > pool.collective_timeout_s - COLLECTIVE_TIMEOUT_MARGIN_S:
            return False
        if key in self._ahead:
            self._ahead.discard(key)
            try:
                pool.wait_ready()
            except DistributedError:
                return False  # replaced, and counted so: the start of a successor failed
            return True
        return pool.idle()

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
        if self.not_preloaded:
            count = len(self.not_preloaded)
            how += (f"; not preloaded, as no installed code: {count} module{'s' if count > 1 else ''} "
                    f"({words(list(self.not_preloaded))})")
        crashed = (f"{self.pools_crashed} calls run again on fresh ranks after a rank of a kept set died in them; "
                   if self.pools_crashed else "")
        return (f"{self.calls} calls, {self.pools_started} pools started ({self.pools_started_ahead} ahead of their "
                f"test), kept across tests {self.pools_kept} times, {self.pools_ended} GPU pools ended with their "
                f"test, {self.pools_replaced} replaced after a dead rank, a hang or a broken failure, "
                f"{self.pools_retired} retired after a test or call left state a fresh rank would not have; "
                f"{crashed}ranks {how}")

    def warm_up(self) -> None:
        """Start the zygote now (it imports torch in the background) rather than at the first call."""
        if self.fork and not self.fork_refused and self._zygote is None:
            self._start_zygote()

    def close(self) -> None:
        """Kill every pool and zygote; safe to call more than once."""
        for key in list(self._pools):
            self._pools.pop(key).kill()
        self._stop_zygote()
        while self._retired:
            self._retired.pop().kill()
        if self._hub is not None:
            self._hub.close()
            self._hub = None
        if self._handover_dir is not None:
            shutil.rmtree(self._handover_dir, ignore_errors=True)
            self._handover_dir = None

    def _discard(self, key: tuple[int, str]) -> None:
        self._ahead.discard(key)
        pool = self._pools.pop(key, None)
        if pool is None:
            return
        retired = pool.intact and pool.unfit
        pool.kill()
        if retired:
            self.pools_retired += 1
            line = f"pool replaced after {self._last_test.get(key) or 'a call'}: {'; '.join(pool.unfit)}"
            self.retirements.append(line)
            self.retired_log.append(line)
        else:
            self.pools_replaced += 1

    def _start_pool(self, world_size: int, device: str, timeout: float) -> RankSet:
        __tracebackhide__ = hidden_from_a_failure
        pool = self._new_pool(world_size, device, timeout)
        if self._fork_ranks(pool):
            try:
                pool.wait_ready()
                self._fork_proven = True
                return pool
            except RankFailedError as forked_error:
                if self._fork_proven or pool.placement is not None:  # no spawned ranks on other hosts
                    raise
                # Forked ranks never formed a pool here: spawned ones settle whether forking is to blame.
                self._discard((world_size, device))
                pool = self._new_pool(world_size, device, timeout)
                pool.spawn()
                pool.wait_ready()
                self.fork_refused = f"forked ranks could not start: rank {forked_error.rank} {forked_error.summary}"
                self._stop_zygote()
                return pool
        pool.spawn()
        pool.wait_ready()
        return pool

    def _new_pool(self, world_size: int, device: str, timeout: float) -> RankSet:
        placement = None
        if self._hosts is not None:
            if self._hub is None:
                self._hub = Hub(self._hosts)
            self._hub.raise_if_lost()
            placement = Placement(self._hub, world_size)
        elif self._handover_dir is None:
            self._handover_dir = handover.make_folder()
        pool = RankSet(world_size, device, collective_timeout_s=collective_timeout(timeout), placement=placement,
                       capture=self.capture, handover_dir=self._handover_dir)
        self._pools[(world_size, device)] = pool
        self._served[(world_size, device)] = 0
        self.pools_started += 1
        return pool

    def _fork_ranks(self, pool: RankSet) -> bool:
        """Fork the pool's ranks from the zygote; False when they must be spawned instead."""
        deadline = time.monotonic() + BOOTSTRAP_TIMEOUT_S
        while self.fork and not self.fork_refused:
            zygote = self._zygote
            if zygote is None or not zygote.alive():
                zygote = self._start_zygote()
            try:
                modules = self._fn_modules if self._preload_level >= 1 else []
                if pool.placement is None:
                    pool.adopt(zygote.fork(pool.specs(), modules, deadline), zygote.exit_code)
                else:
                    self._fork_across_hosts(pool, zygote, modules, deadline)
                return True
            except ForkRefused as refused:
                self._retire_zygote()
                if self._preload_level > 0 and not refused.bare:
                    self._preload_level -= 1
                    self.preload_refused = str(refused)
                else:
                    self.fork_refused = str(refused)
            except BaseException:  # still importing at the deadline, or interrupted
                self._stop_zygote()
                raise
        return False

    def _fork_across_hosts(self, pool: RankSet, zygote: Zygote, modules: list[str], deadline: float) -> None:
        """Host 0's ranks from this host's zygote, every other host's from its agent."""
        placement, specs = pool.placement, pool.specs()
        assert placement is not None  # only called for a pool across hosts
        remote = placement.remote_ranks()
        placement.hub.wait_agents(len(remote) + 1, deadline)
        local = [spec for spec in specs if placement.host_of(spec.rank) == 0]
        pids = dict(zip((spec.rank for spec in local), zygote.fork(local, modules, deadline), strict=True))
        for host, ranks in remote.items():
            forked = placement.hub.fork(host, [specs[rank] for rank in ranks], modules, list(sys.path), deadline)
            pool.adopt_remote(dict(zip(ranks, forked, strict=True)))
            pids.update(zip(ranks, forked, strict=True))
        pool.adopt([pids[rank] for rank in range(len(specs))], zygote.exit_code)

    def _start_zygote(self) -> Zygote:
        self._retire_zygote()
        zygote = self._zygote = Zygote(log=self.capture.log if self.capture is not None else None,
                                       not_preloaded=self.not_preloaded)
        if self._preload_level >= 2 and self._rank_modules:
            zygote.preload(list(self._rank_modules))
        return zygote

    def _retire_zygote(self) -> None:
        """Stop forking from the zygote; it lives on while the ranks it forked (which die with it) serve."""
        if self._zygote is not None:
            self._retired.append(self._zygote)
            self._zygote = None

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


def _print_stacks(pool: RankSet, error: BaseException) -> None:
    """The ranks' stacks on stderr (pytest shows it with the test's failure) when the wait for them was cut
    short by something else than the launcher: pytest-timeout, an interrupt."""
    stacks = pool.stacks(list(range(pool.world_size)))
    print(f"rank pool: {type(error).__name__} while the ranks ran; the Python stack of every rank:", file=sys.stderr)
    for rank, stack in stacks.items():
        print(f"--- rank {rank} ---\n{stack.rstrip()}", file=sys.stderr, flush=True)


def current_test() -> str:
    """The running pytest test's id, or an empty string outside pytest."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]


def _record_timing(world_size: int, device: str, fn: Callable[..., Any], outcome: str, work: list,
                   call_s: float, pool_start_s: float) -> None:
    """One JSON line per call to HARNESS_RANKS_TIMING: fn's seconds on each rank, the call's wall time."""
    path = os.environ.get(TIMING_ENV)
    if not path:
        return
    known = [seconds for seconds in work if seconds is not None]
    record = {"test": current_test(), "world_size": world_size,
              "device": device, "fn": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}",
              "outcome": outcome, "work_s": max(known) if known else None, "rank_work_s": work,
              "call_s": round(call_s, 6), "pool_start_s": round(pool_start_s, 6)}
    # Appended to a regular file only, never through a link: the path comes from the environment.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with open(descriptor, "a") as timing:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(f"{TIMING_ENV}={path}: not a regular file")
        timing.write(json.dumps(record) + "\n")
