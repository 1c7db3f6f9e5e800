"""pytest plugin: the `ranks` fixture, running test functions on ranks, and the rank pool (ranks kept across tests
while they are as fresh ones, harness.ranks.boundary).

Registered through the `pytest11` entry point (installed harness), or `-p harness.ranks.plugin`, so its
options (`--no-ranks-pool`) exist when the command line is parsed.

- `ranks.run(world_size, fn, *args)` runs `fn(*args)` on `world_size` ranks (NCCL with one GPU each when
  CUDA is there, gloo on CPU) and returns each rank's value in rank order. A test parametrized with
  `world_size` is skipped before it starts when there are too few GPUs ("needs N GPUs") or CPU ranks
  ("needs N ranks"; HARNESS_CPU_RANKS sets how many, 2 when unset). Before it skips, it records what it needed
  and what the host has as JUnit properties (contract.NEEDS_WORLD_SIZE, HOST_RANKS, HOST_RANK_UNIT): reports
  count such a case as not run from these, never from the skip's words. A case that launches records
  contract.WORLD_SIZE first, so a failed case has it too.
- Each rank's peak allocator memory on GPU becomes the JUnit properties `peak_allocated_mib.rankR` and
  `peak_reserved_mib.rankR`; `ranks.record(name=value, ...)` records the case's own metrics, through
  `record_property` (pytest writes them with `-o junit_family=xunit1`).
- The launcher is `config.stash[LAUNCHER_KEY]`: a `PoolLauncher` by default, `run_distributed` (one spawn
  per call) with `--no-ranks-pool`, the ini `ranks_pool = false` or `HARNESS_RANKS_POOL=0`;
  `HARNESS_RANKS_POOL=spawn` keeps the pool but spawns its ranks. A plugin may put another launcher there.
- A launch times out a little before the test's pytest-timeout, so a hang fails with every rank's stack
  instead of pytest-timeout's dump of the waiting parent.
- What the ranks write in a test's calls is that test's: sections of its report, not the terminal (unless
  `-s`); what they write outside calls goes to the rank log (`--ranks-log`). See harness.ranks.sections.
- A long session's terminal gets a line now and then with the tests finished, the time elapsed and about how long
  is left (harness.ranks.progress).

Needs the standard library and pytest (and torch, to count GPUs).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

import pytest

from harness.contract import (
    HOST_RANK_UNIT,
    HOST_RANKS,
    LAUNCH_FAILED,
    LAUNCH_HOST_LOST,
    LAUNCH_RANK_DIED,
    LAUNCH_TIMED_OUT,
    NEEDS_WORLD_SIZE,
    PEAK_ALLOCATED_PREFIX,
    PEAK_RESERVED_PREFIX,
    POOL_REPLACED,
    RANK_UNIT_CPU,
    RANK_UNIT_GPUS,
    WORLD_SIZE,
)
from harness.environment import CPU_RANKS_ENV, RUNNING_TEST_FILE_ENV
from harness.environment import RANKS_POOL_ENV as POOL_ENV
from harness.ranks import packing, progress, sections
from harness.ranks.failures import HostLostError, RankFailedError, RankTimeoutError, hidden_from_a_failure
from harness.ranks.hosts import HostsConfig
from harness.ranks.pool import PoolLauncher
from harness.ranks.protocol import DEFAULT_TIMEOUT_S, RankOutput, RankResult
from harness.ranks.spawn import run_distributed

DEFAULT_CPU_RANKS = 2
POOL_HELP = ("keep ranks, their process groups and warm caches across tests while an audit finds them as fresh ones, "
             "forked from a template that has imported torch and the suite, instead of spawning them for every call "
             f"(default on; {POOL_ENV}=0 turns it off, {POOL_ENV}=spawn spawns the pool's ranks)")
POOL_MODES = {"0": None, "1": "fork", "spawn": "spawn"}
# The launch ends this long before pytest-timeout fires, leaving time to collect stacks and kill the ranks.
TIMEOUT_MARGIN_S = 30.0
RETIREMENTS_SHOWN = 3  # in the session's summary
MIN_LAUNCH_TIMEOUT_S = 10.0

Launcher = Callable[..., list[RankResult]]  # (world_size, fn, *args, timeout=seconds) -> results by rank
LAUNCHER_KEY = pytest.StashKey[Launcher]()
POOL_KEY = pytest.StashKey[PoolLauncher]()
pytest_plugins = ["harness.ranks.order"]


# ---------------------------------------------------------------- hooks, in lifecycle order


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    # Registered here, not through pytest_plugins: this module imports it (coordinating), and pytest would warn that
    # an imported plugin's asserts cannot be rewritten. Its own pytest_addoption runs on registration.
    if not pluginmanager.is_registered(packing):
        pluginmanager.register(packing, "harness.ranks.packing")
    group = parser.getgroup("harness")
    group.addoption("--ranks-pool", action="store_true", default=None, dest="ranks_pool", help=POOL_HELP)
    group.addoption("--no-ranks-pool", action="store_false", dest="ranks_pool",
                    help=f"spawn fresh ranks for every test (as {POOL_ENV}=0)")
    parser.addini("ranks_pool", type="bool", default=True, help=POOL_HELP)
    group.addoption("--ranks-log", metavar="PATH", default=None, dest="ranks_log", help=sections.RANKS_LOG_HELP)
    parser.addini("ranks_log", default="", help=sections.RANKS_LOG_HELP)


def pytest_configure(config: pytest.Config) -> None:
    mode = pool_mode(config)
    if mode != "fork" and HostsConfig.from_environment() is not None:
        raise pytest.UsageError("a cell across hosts places its ranks through the forked rank pool; "
                                f"{POOL_ENV}=0, --no-ranks-pool and {POOL_ENV}=spawn cannot reach other hosts")
    config.stash[packing.RANKS_KEY] = lambda: available_ranks()[0]
    if LAUNCHER_KEY in config.stash:  # another plugin chose the launcher
        return
    capture = sections.output_capture(config)
    if mode is None:
        spawning: Launcher = functools.partial(run_distributed, capture=capture)
        config.stash[LAUNCHER_KEY] = spawning
        return
    launcher = PoolLauncher(fork=mode == "fork", capture=capture)
    config.stash[POOL_KEY] = launcher
    pooled: Launcher = launcher
    config.stash[LAUNCHER_KEY] = pooled


def pytest_collection_finish(session: pytest.Session) -> None:
    progress.start(session)  # a line now and then on how far a long session is, and about how long is left
    # The zygote imports torch while pytest sets up the first test's fixtures.
    launcher = session.config.stash.get(POOL_KEY, None)
    if launcher is None or session.config.option.collectonly or packing.coordinating(session.config):
        return  # a packed session's coordinator runs no test itself
    if any("ranks" in getattr(item, "fixturenames", ()) for item in session.items):
        launcher.warm_up()


def pytest_report_header(config: pytest.Config) -> str:
    launcher = config.stash.get(POOL_KEY, None)
    if launcher is None:
        return "rank pool: off (ranks spawned for every call)"
    return f"rank pool: on (ranks {'forked from a zygote' if launcher.fork else 'spawned'})"


def pytest_runtest_logstart(nodeid: str, location) -> None:
    """Under `harness run`: the running test's id in the cell's folder, so a cell stopped mid-test names it."""
    path = os.environ.get(RUNNING_TEST_FILE_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as running:
            running.write(nodeid + "\n")


def pytest_runtest_logfinish(nodeid: str, location) -> None:
    path = os.environ.get(RUNNING_TEST_FILE_ENV)
    if path:
        with contextlib.suppress(OSError):
            os.remove(path)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    return (yield from sections.attaching(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from sections.attaching(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """Once the test's fixtures are gone, the pools its calls used are audited: kept for the next test, or retired
    and forked afresh. A pool replaced because of this test (a call, or the test, left what could not be put back)
    is named in this test's report (a section, and the JUnit property POOL_REPLACED)."""
    try:
        return (yield from sections.attaching(item, "teardown"))
    finally:
        launcher = item.config.stash.get(POOL_KEY, None)
        if launcher is not None:  # also a test that reached the launcher without the fixture
            for line in launcher.renew():
                item.user_properties.append((POOL_REPLACED, line))
                item.add_report_section("teardown", "rank pool", line)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    launcher = config.stash.get(POOL_KEY, None)
    if launcher is not None and launcher.calls:
        terminalreporter.write_line(f"rank pool: {launcher.summary()}")
        # Retiring a set is how kept ranks stay fresh, not a fault: the first few say why; each test's report has its
        # own (the JUnit property POOL_REPLACED).
        for line in launcher.retired_log[:RETIREMENTS_SHOWN]:
            terminalreporter.write_line(f"rank pool: {line}")
        if len(launcher.retired_log) > RETIREMENTS_SHOWN:
            terminalreporter.write_line(f"rank pool: and {len(launcher.retired_log) - RETIREMENTS_SHOWN} more "
                                        f"retirements, each in its test's report ({POOL_REPLACED})")
    log_line = sections.log_summary(config)
    if log_line is not None:
        terminalreporter.write_line(log_line)


def pytest_unconfigure(config: pytest.Config) -> None:
    launcher = config.stash.get(POOL_KEY, None)
    if launcher is not None:
        launcher.close()
    sections.remove_empty_log(config)


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


# ---------------------------------------------------------------- the fixture


def available_ranks() -> tuple[int, str]:
    """How many ranks this machine can run, and what they are: ("GPUs") with CUDA, ("ranks") on CPU."""
    try:
        import torch
    except ImportError:
        pass  # no torch: CPU ranks, as without CUDA
    else:
        if torch.cuda.is_available():
            return torch.cuda.device_count(), RANK_UNIT_GPUS
    value = os.environ.get(CPU_RANKS_ENV, "").strip()
    if not value:
        return DEFAULT_CPU_RANKS, RANK_UNIT_CPU
    try:
        count = int(value)
    except ValueError:
        raise pytest.UsageError(f"{CPU_RANKS_ENV} must be a whole number of CPU ranks, got {value!r}") from None
    if count < 1:
        raise pytest.UsageError(f"{CPU_RANKS_ENV} must be at least 1, got {count}")
    return count, RANK_UNIT_CPU


def skip_if_too_few_ranks(world_size: int, record_property: Callable[[str, object], None]) -> None:
    """Skip the test with `needs N GPUs` / `needs N ranks` when this machine has fewer; first record, as data,
    what it needed and what the host has (a skipped test's properties still reach junit.xml)."""
    count, unit = available_ranks()
    if world_size <= count:
        return
    record_property(NEEDS_WORLD_SIZE, world_size)
    record_property(HOST_RANKS, count)
    record_property(HOST_RANK_UNIT, unit)
    hint = f"{count} visible" if unit == RANK_UNIT_GPUS else f"{CPU_RANKS_ENV}={count}"
    pytest.skip(f"needs {world_size} {unit} ({hint})")


def configured_test_timeout(item: pytest.Item) -> float | None:
    """The test's pytest-timeout in seconds, as pytest-timeout reads it (marker, option, ini, environment)."""
    marker = item.get_closest_marker("timeout")
    candidates = []
    if marker is not None:
        candidates.append(marker.args[0] if marker.args else marker.kwargs.get("timeout"))
    for read in (lambda: item.config.getoption("timeout"), lambda: item.config.getini("timeout")):
        with contextlib.suppress(ValueError):  # ValueError: pytest-timeout is not installed
            candidates.append(read())
    candidates.append(os.environ.get("PYTEST_TIMEOUT"))
    for candidate in candidates:
        if candidate not in (None, ""):
            seconds = float(candidate)
            return seconds if seconds > 0 else None
    return None


def launch_timeout(item: pytest.Item) -> float:
    """Seconds a launch may take: the test's pytest-timeout less a margin, or the launcher's default."""
    seconds = configured_test_timeout(item)
    if seconds is None:
        return DEFAULT_TIMEOUT_S
    return max(MIN_LAUNCH_TIMEOUT_S, seconds - TIMEOUT_MARGIN_S)


class Ranks:
    """Runs functions on ranks for one test and records their measurements as JUnit properties."""

    def __init__(self, launcher: Launcher, record_property: Callable[[str, object], None], timeout_s: float,
                 session: pytest.Session | None = None, item: pytest.Item | None = None):
        self._launcher = launcher
        self._record_property = record_property
        self.timeout_s = timeout_s
        self._session = session
        self._item = item  # the test whose report gets what the ranks write

    def require(self, world_size: int) -> None:
        """Skip the test when this machine cannot run `world_size` ranks, recording why as data."""
        skip_if_too_few_ranks(world_size, self._record_property)

    def run(self, world_size: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """`fn(*args)` on every rank; each rank's return value, in rank order."""
        __tracebackhide__ = hidden_from_a_failure
        if self._item is not None:
            fail_beyond_declared(self._item, world_size)
        self.require(world_size)
        # Before the launch: a case that ran and failed is still a distributed case that ran.
        self._record_property(WORLD_SIZE, world_size)
        try:
            results = self._launcher(world_size, fn, *args, timeout=self.timeout_s)
        except BaseException as error:  # a failure, a hang, an interrupt: what the ranks wrote until then
            self._keep_output(getattr(error, "rank_outputs", None) or {})
            failed = launch_failure(error)
            if failed is not None:
                self._record_property(LAUNCH_FAILED, failed)
            if isinstance(error, HostLostError) and self._session is not None:
                self._session.shouldstop = str(error)  # a cell across hosts cannot go on without one host
            raise
        self._keep_output({result.rank: result.output for result in results if result.output is not None})
        for result in results:
            if result.peak_allocated_mib is not None:
                self._record_property(f"{PEAK_ALLOCATED_PREFIX}rank{result.rank}", round(result.peak_allocated_mib, 1))
            if result.peak_reserved_mib is not None:
                self._record_property(f"{PEAK_RESERVED_PREFIX}rank{result.rank}", round(result.peak_reserved_mib, 1))
        return [result.value for result in results]

    def _keep_output(self, outputs: dict[int, RankOutput]) -> None:
        if self._item is not None:
            sections.keep(self._item, outputs)

    def record(self, **metrics: object) -> None:
        """Record the case's metrics (max_rel_grad_error=..., grad_error_bound=..., ...) as properties."""
        for name, value in metrics.items():
            self._record_property(name, value)


def fail_beyond_declared(item: pytest.Item, world_size: int) -> None:
    """A test that declares its world size (harness.ranks.packing.declared_world_size) may not call more ranks: a
    packed worker holds only that many GPUs or cores, so the test would skip or crowd its neighbours."""
    declared = packing.declared_world_size(item)
    if declared is not None and world_size > declared:
        pytest.fail(f"{item.nodeid} declares {declared} ranks (a world_size parameter or marker) and calls "
                    f"{world_size}: declare the most it runs at once", pytrace=False)


def launch_failure(error: BaseException) -> str | None:
    """How a launch failed, as the launcher saw it (contract.LAUNCH_FAILURES), for triage to read as data; None where
    a rank raised an exception of its own (the case's failure, whatever its words) or the launch was interrupted."""
    if isinstance(error, HostLostError):
        return LAUNCH_HOST_LOST
    if isinstance(error, RankTimeoutError):
        return LAUNCH_TIMED_OUT
    if isinstance(error, RankFailedError) and error.error_type is None:  # the first rank to fail died without a word
        return LAUNCH_RANK_DIED
    return None


@pytest.fixture
def ranks(request: pytest.FixtureRequest, record_property) -> Ranks:
    """Runs picklable module-level functions on N ranks; see `Ranks`."""
    declared = packing.declared_world_size(request.node)
    if declared is not None:
        skip_if_too_few_ranks(declared, record_property)
    launcher = request.config.stash.get(LAUNCHER_KEY, run_distributed)
    return Ranks(launcher, record_property, launch_timeout(request.node), request.session, request.node)
