"""A cell's process that outruns the cell's end by forking in a chain: each copy forks the next and exits at once
(hundreds of copies a second here), so the pid a scan found is gone by the time a signal for it goes, and the
newest copy is one no scan saw (issue 44). Played three ways through the containment's end, and through
`harness run`:

- a plain chain under the child subreaper alone (HARNESS_CELL_CGROUP=off), on every Linux host;
- a chain that first writes itself into the cgroup root's cgroup.procs by the cgroup2 mount's path (root may, and
  so may a user into a cgroup delegated to it): where harness runs as root the cell's mounts show its own cgroup
  as the root (harness.containment.confine), so it stays in, and is frozen and killed with the cgroup;
- as root, a chain that goes around those namespaces (through /proc/PID/root of a process outside them) and does
  leave the cell's cgroup: harness ends it as a descendant, stopping each copy it finds until none runs.

Every copy holds the write end of a FIFO the test reads: end-of-file there means the last copy is gone, a
condition to wait on rather than a time. The record must say the chain was killed and nothing survived."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from process_helpers import REPO, cgroup_unavailable

from harness.containment import cgroup, confine, reaper
from harness.containment.cgroup import own_cgroup
from harness.containment.containment import Containment

NO_CGROUP = cgroup_unavailable()
needs_cgroup = pytest.mark.skipif(bool(NO_CGROUP), reason=f"cgroup v2 is not writable here: {NO_CGROUP}")
needs_subreaper = pytest.mark.skipif(not reaper.adopt_orphans(False), reason="needs PR_SET_CHILD_SUBREAPER (Linux)")
needs_root = pytest.mark.skipif(not confine.can_confine(),
                                reason="only root (CAP_SYS_ADMIN) gets the cell's namespaces, and can go around them")

COPIES_BEFORE_THE_END = 200  # the chain has been forking for a while when the cell ends
DEADLINE_S = 120  # generous: the machine may be loaded; a pass never waits this long

# argv: FIFO BEAT RECORD GO [CGROUP_PROCS...]. Holds the FIFO's write end (every copy inherits it), moves itself
# into the first cgroup.procs that takes its pid, writes its pid to RECORD, waits for GO, then forks in a chain,
# writing how many copies so far to BEAT.
CHAIN = """
import os, struct, sys, time
fifo, beat, record, go = sys.argv[1:5]
alive = os.open(fifo, os.O_WRONLY)
for target in sys.argv[5:]:
    try:
        with open(target, "w") as procs:
            procs.write(str(os.getpid()))
        break
    except OSError:
        continue
with open(record + ".part", "w") as written:
    written.write(str(os.getpid()))
os.rename(record + ".part", record)
while not os.path.exists(go):
    time.sleep(0.01)
counter = os.open(beat, os.O_WRONLY | os.O_CREAT, 0o600)
copies = 0
while True:
    if os.fork():
        os._exit(0)
    copies += 1
    os.pwrite(counter, struct.pack("q", copies), 0)
"""


class Chain:
    """The files of one chain: its FIFO (read end held here), counter, pid record and go file."""

    def __init__(self, folder: Path):
        self.fifo, self.beat, self.record, self.go = (folder / name for name in ("alive", "beat", "pid", "go"))
        os.mkfifo(self.fifo)
        self.reader = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)  # before any writer: open() would block
        self.first: subprocess.Popen | None = None  # where this process started it

    def argv(self, *targets: str) -> list[str]:
        return [sys.executable, "-c", CHAIN, str(self.fifo), str(self.beat), str(self.record), str(self.go),
                *targets]

    def first_pid(self) -> int:
        """The pid of the chain's first process once it has moved itself (it leads the chain's process group)."""
        wait_for(lambda: self.record.exists(), "the chain's first process to start")
        return int(self.record.read_text())

    def copies(self) -> int:
        try:
            return struct.unpack("q", self.beat.read_bytes()[:8])[0]
        except (OSError, struct.error):
            return 0

    def run_until_forking(self) -> None:
        self.go.touch()
        if self.first is not None:  # it forks and exits at once: its copies are orphans
            self.first.wait(timeout=DEADLINE_S)
        wait_for(lambda: self.copies() >= COPIES_BEFORE_THE_END, f"{COPIES_BEFORE_THE_END} copies of the chain")

    def all_gone(self, wait_s: float = DEADLINE_S) -> bool:
        """Whether every copy is gone (the FIFO's last writer closed it), waiting up to `wait_s` for it: a pass
        returns at once, since the cell's end returns only after its kills."""
        poller = select.poll()
        poller.register(self.reader, select.POLLIN | select.POLLHUP)
        end = time.monotonic() + wait_s
        while True:
            if poller.poll(max(0.0, end - time.monotonic()) * 1000) and os.read(self.reader, 1) == b"":
                return True
            if time.monotonic() >= end:
                return False

    def kill_what_is_left(self) -> None:
        """The test's own cleanup where the chain outlived the cell: one signal to its process group (led by its
        first process) reaches a copy mid-fork too. Never once it is gone: the group's number may be reused."""
        if self.record.exists() and not self.all_gone(wait_s=0):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(self.record.read_text()), signal.SIGKILL)
            assert self.all_gone(), "the test could not end its own chain"
        os.close(self.reader)


def wait_for(condition, what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < end, f"waited {DEADLINE_S} s for {what}"
        time.sleep(0.01)


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[Chain]:
    played = Chain(tmp_path)
    yield played
    played.kill_what_is_left()


def start(containment: Containment, chain: Chain, *targets: str) -> None:
    """The chain as the cell's first process, started as harness starts pytest."""
    with containment.born_inside():
        chain.first = subprocess.Popen(containment.confined(chain.argv(*targets)), start_new_session=True)
    containment.spare(chain.first.pid)


def root_cgroup_procs(folder: Path) -> str:
    """cgroup.procs of the root of the cgroup2 mount that holds cgroup `folder` (/sys/fs/cgroup, or .../unified)."""
    while not os.path.ismount(folder):
        folder = folder.parent
    return str(folder / "cgroup.procs")


def end_and_check(containment: Containment, chain: Chain, mechanism: str) -> None:
    ended = containment.end()
    assert chain.all_gone(), f"the chain outlived its cell's end ({chain.copies()} copies so far): {ended}"
    assert (ended.mechanism, ended.survivors) == (mechanism, []), ended
    assert ended.killed >= 1, ended  # the copy running when the cell ended


@needs_subreaper
def test_a_fork_chain_under_the_subreaper_alone_is_dead_when_the_cells_end_returns(chain):
    containment = Containment(use_cgroup=False)
    try:
        start(containment, chain)
        chain.run_until_forking()
        end_and_check(containment, chain, "subreaper")
    finally:
        containment.end()


@needs_cgroup
def test_a_fork_chain_that_wrote_itself_into_the_cgroup_root_is_dead_when_the_cells_end_returns(chain):
    containment = Containment()
    try:
        # The root's cgroup.procs by the mount's path; where that is refused (a delegated user), the cgroup harness
        # runs in, which its user may write.
        start(containment, chain, root_cgroup_procs(containment.cgroup.path),
              str(containment.cgroup.parent / "cgroup.procs"))
        moved = chain.first_pid()
        if confine.can_confine():  # the path led to the cell's own cgroup: it never left
            assert moved in containment.cgroup.pids()
        else:
            assert moved not in containment.cgroup.pids()
        chain.run_until_forking()
        end_and_check(containment, chain, "cgroup")
    finally:
        containment.end()


@needs_cgroup
@needs_root
def test_a_fork_chain_that_went_around_the_cells_namespaces_is_dead_when_the_cells_end_returns(chain):
    """Root reaches the host's mount through a process outside the namespaces (here this one): it leaves the
    cgroup, and is ended as a descendant of harness."""
    containment = Containment()
    try:
        outside = f"/proc/{os.getpid()}/root{root_cgroup_procs(containment.cgroup.path)}"
        start(containment, chain, outside)
        assert chain.first_pid() not in containment.cgroup.pids(), "the chain did not leave the cell's cgroup"
        chain.run_until_forking()
        end_and_check(containment, chain, "cgroup")
    finally:
        containment.end()


# ------------------------------------------------------------------------------------------- through harness run

SUITE = f"""
import json, os, struct, subprocess, time


def copies(beat):
    try:
        with open(beat, "rb") as counter:
            return struct.unpack("q", counter.read(8))[0]
    except (OSError, struct.error):
        return 0


def test_leaves_a_fork_chain_behind():
    argv = json.loads(os.environ["CHAIN_ARGV"])
    beat, go = argv[4], argv[6]
    subprocess.Popen(argv, start_new_session=True)
    open(go, "w").close()
    while copies(beat) < {COPIES_BEFORE_THE_END}:
        time.sleep(0.01)
"""


@pytest.mark.parametrize("mechanism", [
    pytest.param("cgroup", marks=needs_cgroup),
    pytest.param("subreaper", marks=needs_subreaper),
])
def test_harness_run_ends_a_fork_chain_its_cell_left_and_env_json_says_so(tmp_path, chain, mechanism):
    """The issue's run: the chain outlived `harness run`, whose env.json said nothing was killed. Under a cgroup
    the chain first writes itself into the root's cgroup.procs."""
    pytest.importorskip("torch")
    from run_helpers import write_suite_matrix

    matrix = write_suite_matrix(tmp_path / "suite", "test_chain.py", SUITE, tmp_path / "chain.yaml",
                                timeout_minutes=4, test_timeout_seconds=None)
    targets = [] if mechanism == "subreaper" else [root_cgroup_procs(own_cgroup())]
    environ = {**os.environ, cgroup.CGROUP_ENV: {"cgroup": "auto", "subreaper": "off"}[mechanism],
               "CHAIN_ARGV": json.dumps(chain.argv(*targets)),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--matrix", str(matrix), "--results",
                           str(tmp_path / "results"), "--env-dir", str(tmp_path / "envs")],
                          env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=4 * DEADLINE_S)
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert chain.copies() >= COPIES_BEFORE_THE_END, output  # the cell's test did start the chain
    assert chain.all_gone(), f"the chain outlived `harness run` ({chain.copies()} copies so far)"
    [folder] = (tmp_path / "results").iterdir()
    cleanup = json.loads((folder / "env.json").read_text())["cleanup"]
    assert (cleanup["mechanism"], cleanup["survivors"]) == (mechanism, []), cleanup
    assert cleanup["killed"] >= 1, cleanup
    assert done.returncode == 0, output



def test_the_cell_gets_a_fresh_mount_in_place_of_each_cgroup2_mount_keeping_its_flags():
    mountinfo = ("31 23 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755\n"
                 "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
                 "41 31 0:38 /.. /sys/fs/cgroup/unified rw,nosuid,nodev,relatime - cgroup2 cgroup2 rw\n"
                 "42 23 0:38 / /mnt/cgroup\\040two ro shared:5 - cgroup2 cgroup2 rw,nsdelegate\n")
    assert confine.cgroup2_mounts(mountinfo) == [("/sys/fs/cgroup/unified", 2 | 4), ("/mnt/cgroup two", 1)]
