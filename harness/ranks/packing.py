"""pytest plugin: a cell's tests packed on its host, several at once on disjoint core or GPU sets (`--pack-tests`,
which `harness run` passes to a cell on one host; `--serial-tests` there turns it off).

The session that collects the tests (the coordinator) runs those that declare no world size (a `world_size`
parameter or marker: `declared_world_size`) itself, one after another, first. The others it groups by what each
needs, its world size, of the host's units: the GPUs CUDA sees, else the cores this process may run on. Groups run
one after another, smallest first; within a group, `units // need` workers run at once, each a pytest process on a
set of units of its own (CUDA_VISIBLE_DEVICES, or its CPU affinity and OMP_NUM_THREADS). They take the group's
tests one at a time from one queue (harness.ranks.group_queue), longest first (`--pack-durations`, a JSON object of
test id to seconds; unknown tests weigh their need, and keep their collection order among themselves), so a worker
idles only once the queue is empty. Where no two tests of the largest group could run at once (a 2-rank suite on
2 cores), the session runs every test itself, as without the option.

Workers send each report as pytest-xdist does (`pytest_report_to_serializable`); the coordinator replays a test's
reports together, once its teardown has arrived, through its own hooks: the terminal, junit.xml, the record
properties, the rank outputs and the exit status are what a serial run gives, in the order tests ended. The test a
worker was in when it died (it crashed, or was stopped) gets a failed report naming the worker and its last output;
the test it held next, and any no worker took, run in the coordinator after the group, as a serial session would
run them. So nothing is lost. Needs the standard library and pytest.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from harness.environment import RUNNING_TEST_FILE_ENV
from harness.ranks.gpushare import MARKER_HELP, host_cpus, one_device_peak, shared_slots
from harness.ranks.group_queue import GroupQueue

PACK_HELP = "run the tests several at once on disjoint GPU or core sets of this host (harness run passes it)"
WORKER_OPTION = "--pack-worker"
# Options a worker must not inherit: the coordinator writes junit.xml and chose the order.
NOT_FOR_WORKERS = ("--junitxml", "--junit-xml", "--random-order", "--pack-tests", "--pack-durations", WORKER_OPTION)
OUTPUT_TAIL_LINES = 30
BEGAN_FILE = "began"  # in a worker's folder: the id of the test it began last
POLL_S = 0.2
COORDINATOR_KEY = pytest.StashKey[bool]()
GROUPS_KEY = pytest.StashKey[list]()  # pack_groups' answer at collection, for the run loop
# How many ranks a test may have here: the ranks plugin's reading of the GPUs or HARNESS_CPU_RANKS (it imports this
# module and sets the key; asked only when packing is, so a session that does not pack never imports torch for it).
RANKS_KEY = pytest.StashKey[Callable[[], int]]()
WORLD_SIZE_MARKER = "world_size"
WORLD_SIZE_MARKER_HELP = (f"{WORLD_SIZE_MARKER}(N): the test runs N ranks though no parameter of it says so; with "
                          "--pack-tests it gets N of the host's GPUs or cores, as one parametrized world_size=N does")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness")
    group.addoption("--pack-tests", action="store_true", default=False, dest="pack_tests", help=PACK_HELP)
    group.addoption("--pack-durations", metavar="JSON", default=None, dest="pack_durations",
                    help="a JSON object of test id to seconds: longer tests start first (with --pack-tests)")
    group.addoption(WORKER_OPTION, metavar="DIR", default=None, dest="pack_worker", help="(internal) a packed "
                    "session's worker: run the tests it takes from DIR's parent's queue, write their reports to DIR")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    config.addinivalue_line("markers", WORLD_SIZE_MARKER_HELP)
    if config.option.pack_worker:
        folder = Path(config.option.pack_worker)
        config.pluginmanager.register(WorkerReports(folder, config), "harness-pack-worker")
        config.pluginmanager.register(GroupFiles(GroupQueue(folder.parent).tests, config.rootpath),
                                      "harness-pack-worker-files")


def coordinating(config: pytest.Config) -> bool:
    """This session hands its tests to workers and runs none itself (known once its tests are collected)."""
    return config.stash.get(COORDINATOR_KEY, False)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    option = session.config.option
    if not (option.pack_tests and not option.pack_worker and not option.collectonly and session.items):
        session.config.stash[COORDINATOR_KEY] = False
        return
    units = host_units()
    groups = pack_groups(session.items, host_ranks(session.config, units), units)
    session.config.stash[GROUPS_KEY] = groups  # the run loop's plan: free GPU memory is read once, here
    session.config.stash[COORDINATOR_KEY] = worth_packing(groups)


def pack_groups(items: Sequence[pytest.Item], capacity: int,
                units: Units) -> list[tuple[int, list[pytest.Item], Units]]:
    """The tests workers take, by need, smallest first, each group with the units its workers split."""
    return [(need, group, group_units(group, need, units)) for need, group in sorted(by_need(items, capacity).items())]


def group_units(items: Sequence[pytest.Item], need: int, units: Units) -> Units:
    """The units a group's workers split: the host's, or for one-device tests on GPUs each GPU as many times as
    such tests may share it (harness.ranks.gpushare)."""
    if units.kind != "gpu" or need != 1:
        return units
    peaks = [one_device_peak(item) for item in items]
    if not peaks or None in peaks:
        return units
    return Units("gpu", shared_slots(units.ids, max(peak for peak in peaks if peak is not None), host_cpus()))


def host_ranks(config: pytest.Config, units: Units) -> int:
    """The most ranks a test may have here (a larger one skips at once)."""
    ranks = config.stash.get(RANKS_KEY, None)
    return ranks() if ranks is not None else len(units.ids)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """A worker keeps its group's tests, in the queue's order (the terminal's count is the group's)."""
    folder = config.option.pack_worker
    if not folder:
        return
    by_id = {item.nodeid: item for item in items}
    items[:] = [by_id[nodeid] for nodeid in GroupQueue(Path(folder).parent).tests if nodeid in by_id]


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    if session.config.option.pack_worker and not (session.config.option.collectonly or session.testsfailed):
        return run_taken(session, Path(session.config.option.pack_worker))  # else pytest's loop says why not
    if not coordinating(session.config):
        return None  # not asked, or one test at a time here whatever we do: the session runs them itself
    durations = read_durations(session.config.option.pack_durations)
    groups = session.config.stash[GROUPS_KEY]
    packed = {item.nodeid for _, group, _ in groups for item in group}
    run_here([item for item in session.items if item.nodeid not in packed], session)
    with tempfile.TemporaryDirectory(prefix="harness-pack-") as scratch:
        for need, group, units in groups:
            queue = GroupQueue.create(Path(scratch) / f"need{need}", queue_order(group, need, durations))
            shares = worker_units(group, need, units, sorted(os.sched_getaffinity(0)))
            left = run_group(session, shares, queue)
            run_here([item for item in group if item.nodeid in left], session)
            if session.shouldfail or session.shouldstop:
                break
    return True


def run_here(items: list[pytest.Item], session: pytest.Session) -> None:
    """Tests that name no world size, in this session, as pytest's own loop runs them."""
    for index, item in enumerate(items):
        if session.shouldfail or session.shouldstop:
            return
        nextitem = items[index + 1] if index + 1 < len(items) else None
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)


def worth_packing(groups: list[tuple[int, list[pytest.Item], Units]]) -> bool:
    """The largest group of tests would run two or more at once (else workers cost their start and save nothing:
    a 2-rank suite on 2 cores)."""
    if not groups:
        return False
    need, items, units = max(groups, key=lambda group: len(group[1]))
    return min(len(items), len(units.ids) // need) >= 2


# ---------------------------------------------------------------- planning


@dataclass(frozen=True)
class Units:
    kind: str  # "gpu" or "cpu"
    ids: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries, or CPU numbers


def host_units() -> Units:
    """The GPUs this process may use (CUDA_VISIBLE_DEVICES as harness set it), else its CPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return Units("gpu", tuple(entry.strip() for entry in visible.split(",") if entry.strip()))
    if visible is None and _cuda_devices() > 0:
        return Units("gpu", tuple(str(index) for index in range(_cuda_devices())))
    return Units("cpu", tuple(str(cpu) for cpu in sorted(os.sched_getaffinity(0))))


def _cuda_devices() -> int:
    if "torch" not in sys.modules:
        return 0  # the suite imports torch before its tests run; a session that has not, launches no GPU test
    torch = sys.modules["torch"]
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def need_of(item: pytest.Item) -> int | None:
    """How many units the test takes: its world size, 1 for a one-device test (None: it names neither, and runs in
    the coordinator)."""
    world = declared_world_size(item)
    if world is not None:
        return world
    return 1 if one_device_peak(item) is not None else None


def declared_world_size(item: pytest.Item) -> int | None:
    """The most ranks the test says it runs at once: the largest of its parameters named `world_size` or ending in
    `_world_size` (a resume on another world runs both), else its `world_size(N)` marker; None where it says neither.
    A call of more ranks than this fails the test (harness.ranks.plugin), so packing's share is never too small."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    worlds = [value for name, value in params.items() if name == "world_size" or name.endswith("_world_size")]
    if worlds:
        if not all(_whole_positive(world) for world in worlds):
            raise pytest.UsageError(f"{item.nodeid}: a world size parameter must be a whole number > 0, got {worlds}")
        return max(worlds)
    marker = item.get_closest_marker(WORLD_SIZE_MARKER)
    if marker is None:
        return None
    world = marker.args[0] if len(marker.args) == 1 and not marker.kwargs else None
    if not _whole_positive(world):
        raise pytest.UsageError(f"{item.nodeid}: {WORLD_SIZE_MARKER}{marker.args or ''}: expected one whole number "
                                f"of ranks > 0, as in {WORLD_SIZE_MARKER}(2)")
    return world


def _whole_positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def by_need(items: Sequence[pytest.Item], capacity: int) -> dict[int, list[pytest.Item]]:
    """The tests that name a world size of at most `capacity` ranks, by it. One larger (a 4-rank test of a 2-rank
    cpu cell) skips at once: it stays with the coordinator rather than cost a worker's start."""
    groups: dict[int, list[pytest.Item]] = {}
    for item in items:
        if (need := need_of(item)) is not None and need <= capacity:
            groups.setdefault(need, []).append(item)
    return groups


def read_durations(path: str | None) -> dict[str, float]:
    """Test id -> seconds; what is not a number of seconds is left out (the file is the caller's, not trusted)."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise pytest.UsageError(f"--pack-durations {path}: not a JSON object of test id to seconds ({error})") \
            from None
    if not isinstance(data, dict):
        raise pytest.UsageError(f"--pack-durations {path}: not a JSON object of test id to seconds")
    return {key: float(value) for key, value in data.items()
            if isinstance(key, str) and isinstance(value, (int, float)) and 0 <= value < 1e6}


@dataclass(frozen=True)
class WorkerUnits:
    kind: str  # "gpu" or "cpu", as the host's Units
    ids: tuple[str, ...]  # the worker's own GPUs or CPUs
    need: int  # units each of its tests takes (its ranks)
    cpus: tuple[int, ...]  # the CPUs its processes run on: its own, or its share of the host's beside its GPUs


def worker_units(items: Sequence[pytest.Item], need: int, units: Units,
                 host_cpus: Sequence[int] = ()) -> list[WorkerUnits]:
    """`len(units) // need` workers of disjoint units (one with every unit where fewer than `need`), no more than
    there are tests. Workers on GPUs split `host_cpus` too: each rank's CPU work (the whole model's reference, its
    kernel launches) would otherwise take a thread per core of the host, and eight workers sharing one H100 ran
    each test 40 times slower than one alone."""
    count = max(1, min(len(items), len(units.ids) // need))
    share = len(units.ids) // count
    shares = [units.ids[index * share:(index + 1) * share] for index in range(count)]
    if units.kind == "cpu":
        return [WorkerUnits(units.kind, ids, need, tuple(int(cpu) for cpu in ids)) for ids in shares]
    return [WorkerUnits(units.kind, ids, need, cpu_share(host_cpus, index, count)) for index, ids in enumerate(shares)]


def cpu_share(cpus: Sequence[int], index: int, count: int) -> tuple[int, ...]:
    """Worker `index` of `count`'s CPUs: an equal run of them, or one (shared) where there are fewer than workers."""
    if not cpus:
        return ()
    per = len(cpus) // count
    return tuple(cpus[index * per:(index + 1) * per]) if per else (cpus[index % len(cpus)],)


def queue_order(items: Sequence[pytest.Item], need: int, durations: dict[str, float]) -> list[str]:
    """The order workers take the tests in: longest first (a long test begun last would keep one worker busy after
    the others ran out); a test without a duration weighs its need, and such tests keep their collection order."""
    return [item.nodeid for item in sorted(items, key=lambda item: durations.get(item.nodeid, float(need)),
                                           reverse=True)]


# ---------------------------------------------------------------- running a group


@dataclass
class Worker:
    units: WorkerUnits
    folder: Path  # its name is the worker's name in the group's queue
    process: subprocess.Popen
    output: BinaryIO
    reports: BinaryIO
    unread: bytes = b""  # the start of a line the worker is still writing
    pending: list[Any] = field(default_factory=list)  # the running test's reports, until its teardown
    done: set[str] = field(default_factory=set)


def run_group(session: pytest.Session, shares: list[WorkerUnits], queue: GroupQueue) -> set[str]:
    """Run the queue's tests on a worker per share of units; the tests no worker began (it died holding one, or
    every worker died first) are returned for the coordinator to run."""
    workers = [_start(session.config, share, queue.folder / f"worker{index}") for index, share in enumerate(shares)]
    items = {item.nodeid: item for item in session.items}
    left: set[str] = set()
    try:
        while any(worker.process.poll() is None for worker in workers):
            for worker in workers:
                _replay(session, worker)
            time.sleep(POLL_S)
    except BaseException:  # Ctrl-C, a signal: the workers stop as a serial session would, and say what they ran
        _stop(workers)
        raise
    finally:
        for worker in workers:
            worker.process.wait()
            _replay(session, worker)
            left |= _lost(session, worker, queue, items)
            worker.output.close()
            worker.reports.close()
    return left | set(queue.unclaimed())


def worker_command(config: pytest.Config, folder: Path) -> list[str]:
    args = [arg for arg in config.invocation_params.args
            if not any(arg == option or arg.startswith(option + "=") for option in NOT_FOR_WORKERS)]
    return [sys.executable, "-m", "pytest", *_drop_values(args), f"{WORKER_OPTION}={folder}"]


def _drop_values(args: list[str]) -> list[str]:
    """Options of NOT_FOR_WORKERS given as two arguments (`--junitxml PATH`) lose their value too."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in NOT_FOR_WORKERS:
            skip = True
            continue
        kept.append(arg)
    return kept


def _start(config: pytest.Config, units: WorkerUnits, folder: Path) -> Worker:
    folder.mkdir()
    # The coordinator names the running test (it replays each); several workers would overwrite one another.
    environ = {name: value for name, value in os.environ.items() if name != RUNNING_TEST_FILE_ENV}
    if units.kind == "gpu":
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(dict.fromkeys(units.ids))  # a shared GPU's slots name it once
    affinity = set(units.cpus)
    if affinity:
        environ["OMP_NUM_THREADS"] = str(max(1, len(affinity) // units.need))
    output = open(folder / "output.log", "wb")  # noqa: SIM115 - closed by run_group
    (folder / "reports.jsonl").touch()
    reports = open(folder / "reports.jsonl", "rb")  # noqa: SIM115 - closed by run_group
    process = subprocess.Popen(worker_command(config, folder), cwd=config.invocation_params.dir, env=environ,
                               stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                               preexec_fn=(lambda: os.sched_setaffinity(0, affinity)) if affinity else None)
    return Worker(units, folder, process, output, reports)


def _replay(session: pytest.Session, worker: Worker) -> None:
    """Hand on every complete test the worker reported: its reports together, as a serial session makes them."""
    hook = session.config.hook
    *lines, worker.unread = (worker.unread + worker.reports.read()).split(b"\n")
    for line in lines:
        report = hook.pytest_report_from_serializable(config=session.config, data=json.loads(line))
        if isinstance(report.longrepr, list):  # a skip's (path, line, reason), a list once through JSON
            report.longrepr = tuple(report.longrepr)
        worker.pending.append(report)
        if report.when == "teardown":
            _emit(session, worker.pending)
            worker.done.add(report.nodeid)
            worker.pending = []


def _emit(session: pytest.Session, reports: list[Any]) -> None:
    hook = session.config.hook
    nodeid, location = reports[0].nodeid, reports[0].location
    hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
    for report in reports:
        hook.pytest_runtest_logreport(report=report)
    hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)


def _lost(session: pytest.Session, worker: Worker, queue: GroupQueue, items: dict[str, pytest.Item]) -> set[str]:
    """The test the worker began and never finished (it died in it, or was stopped) gets a failed report, with the
    worker's last words. The tests it took but never began (the one it held next; one its collection lacked; those
    after a -x stop) are returned, to run elsewhere."""
    unfinished = [nodeid for nodeid in queue.claimed_by(worker.folder.name) if nodeid not in worker.done]
    began = _read(worker.folder / BEGAN_FILE)
    if began in unfinished and began in items:
        unfinished.remove(began)
        item = items[began]
        reports = worker.pending if worker.pending and worker.pending[0].nodeid == began else []
        tail = _tail(worker.folder / "output.log")
        words = (f"the packed worker on units {','.join(worker.units.ids)} exited with code "
                 f"{worker.process.returncode} during this test; its last output:\n{tail}")
        report = pytest.TestReport(began, item.location, {name: 1 for name in item.keywords}, "failed", words,
                                   "call" if reports else "setup", user_properties=list(item.user_properties))
        _emit(session, [*reports, report])
    worker.pending = []
    return set(unfinished)


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(encoding="utf-8")
    return ""


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(lines[-OUTPUT_TAIL_LINES:])
    return "(no output)"


def _stop(workers: list[Worker]) -> None:
    """SIGINT to every worker (pytest ends its test and reports), then SIGKILL to one that does not end."""
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            worker.process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 30
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        if worker.process.poll() is None:
            worker.process.kill()


# ---------------------------------------------------------------- in a worker


class WorkerReports:
    """A worker's reports, one JSON line each, in the folder the coordinator reads; and the test it began last."""

    def __init__(self, folder: Path, config: pytest.Config):
        self.path = folder / "reports.jsonl"
        self.began = folder / BEGAN_FILE
        self.config = config

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.began.write_text(nodeid, encoding="utf-8")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        with open(self.path, "a", encoding="utf-8") as reports:
            reports.write(json.dumps(data) + "\n")


class GroupFiles:
    """A worker collects only the files that hold its group's tests: collecting the whole suite again in every
    worker of every group cost each start seconds (the one-device tier's file alone: 5 s of a 13 s collection on
    this 2-core machine). Whatever it still lacks runs in the coordinator (`_lost`), so a file wrongly left out
    costs time, never a test."""

    def __init__(self, nodeids: Sequence[str], rootpath: Path) -> None:
        self.files = {(rootpath / nodeid.split("::", 1)[0]).resolve() for nodeid in nodeids}
        self.folders = {folder for path in self.files for folder in path.parents}

    def pytest_ignore_collect(self, collection_path: Path) -> bool | None:
        path = collection_path.resolve()
        if path in self.files or path in self.folders:
            return None  # the other plugins (and pytest's own rules) still decide
        if path.is_dir():
            return True
        # a test module of no test of the group; conftest.py and __init__.py still load where pytest loads them
        return True if path.suffix == ".py" and path.name not in ("conftest.py", "__init__.py") else None


def run_taken(session: pytest.Session, folder: Path) -> bool:
    """A worker's run loop: the group's tests, one at a time as it takes them from the queue."""
    queue = GroupQueue(folder.parent)
    items = {item.nodeid: item for item in session.items}

    def take() -> pytest.Item | None:
        while (nodeid := queue.claim(folder.name)) is not None:
            if nodeid in items:
                return items[nodeid]
            # else the coordinator runs it: it stays unfinished in the queue's log
        return None

    item = take()
    while item is not None:
        following = TakenAtTeardown(take)
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=following)
        if session.shouldfail:  # -x or --maxfail: take no more, end as pytest's own loop ends
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        item = following.resolve()
    return True


class TakenAtTeardown:
    """`nextitem` for pytest_runtest_protocol: the next test, taken from the queue only when pytest's teardown asks
    which it is (to keep the module's and session's fixtures that both tests use). Taken earlier, a worker would hold
    a test it cannot begin while its current one runs, and another worker could run dry meanwhile. Where the queue
    is empty it is falsy and its chain is empty, as pytest reads a None: every fixture is torn down."""

    def __init__(self, take: Callable[[], pytest.Item | None]) -> None:
        self._take = take
        self._taken = False
        self._item: pytest.Item | None = None

    def resolve(self) -> pytest.Item | None:
        if not self._taken:  # once: pytest-rerunfailures keeps it for a re-run's teardown
            self._item, self._taken = self._take(), True
        return self._item

    def __bool__(self) -> bool:
        return self.resolve() is not None

    def listchain(self) -> list[Any]:
        item = self.resolve()
        return item.listchain() if item is not None else []

    def __getattr__(self, name: str) -> Any:  # any other reading of nextitem reads the test it stands for
        item = self.resolve()
        if item is None:
            raise AttributeError(name)
        return getattr(item, name)
