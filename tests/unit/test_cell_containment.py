"""The parts that end a cell's processes (harness.containment.containment): where this process's cgroup shows, the
choice of HARNESS_CELL_CGROUP, killing in rounds through pidfds, and a containment's end with and without
cgroup.kill, or with no cgroup at all. Real processes throughout; the attacks are in test_hostile_cell.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from process_helpers import cgroup_unavailable, is_alive

from harness.containment import cgroup, pidkill, reaper
from harness.containment.cgroup import CellCgroup, CgroupUnavailable, cgroup_folder
from harness.containment.containment import Containment
from harness.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


needs_cgroup = pytest.mark.skipif(bool(cgroup_unavailable()), reason=f"{cgroup_unavailable()}")
needs_subreaper = pytest.mark.skipif(not reaper.adopt_orphans(False), reason="needs PR_SET_CHILD_SUBREAPER (Linux)")

PURE_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
HYBRID = ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
          "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
          "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
SUBTREE = "50 40 0:26 /system.slice/runner.service /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
SPACED = "30 23 0:26 / /mnt/cgroup\\040two rw - cgroup2 cgroup2 rw\n"


@pytest.mark.parametrize(("membership", "mountinfo", "expected"), [
    ("0::/user.slice/session-2.scope\n", PURE_V2, "/sys/fs/cgroup/user.slice/session-2.scope"),
    ("4:memory:/x\n0::/\n", HYBRID, "/sys/fs/cgroup/unified"),  # a hybrid host: v2 beside the v1 controllers
    ("0::/\n", PURE_V2, "/sys/fs/cgroup"),  # a container with its own cgroup namespace
    ("0::/system.slice/runner.service/job\n", SUBTREE, "/sys/fs/cgroup/job"),  # a mount of a subtree
    ("0::/a\n", SPACED, "/mnt/cgroup two/a"),
])
def test_the_cgroup_folder_is_found_on_every_kind_of_mount(membership, mountinfo, expected):
    assert cgroup_folder(membership, mountinfo) == Path(expected)


@pytest.mark.parametrize(("membership", "mountinfo", "message"), [
    ("4:memory:/x\n", HYBRID, "in no cgroup v2 hierarchy"),  # v1 only
    ("0::/x\n", HYBRID.replace("cgroup2 cgroup2", "tmpfs tmpfs"), "no cgroup2 mount shows"),
    ("0::/elsewhere\n", SUBTREE, "no cgroup2 mount shows"),  # the mount holds another part of the tree
])
def test_no_cgroup_folder_says_why(membership, mountinfo, message):
    with pytest.raises(CgroupUnavailable, match=message):
        cgroup_folder(membership, mountinfo)


@pytest.mark.parametrize(("value", "wanted"), [(None, True), ("", True), ("auto", True), ("off", False)])
def test_harness_cell_cgroup_takes_auto_or_off(value, wanted):
    assert cgroup.wanted({} if value is None else {cgroup.CGROUP_ENV: value}) is wanted


def test_a_bad_harness_cell_cgroup_stops_the_run_before_any_cell_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"\$HARNESS_CELL_CGROUP: expected auto or off, got 'yes'"):
        cgroup.wanted({cgroup.CGROUP_ENV: "yes"})
    matrix = tmp_path / "one.yaml"
    matrix.write_text(textwrap.dedent("""
        axes: {gpu: [cpu], gpus: [2], torch: ["2.13.0"], transformers: ["5.24.0"]}
        suite: ["."]
    """))
    environ = {**os.environ, cgroup.CGROUP_ENV: "yes",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--dry-run", "--matrix", str(matrix)],
                          env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == "harness: error: $HARNESS_CELL_CGROUP: expected auto or off, got 'yes'"


def sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "100000"])


def test_a_pid_that_names_another_process_than_the_scan_saw_is_not_signalled():
    stranger = sleeper()
    try:
        started = pidkill.start_time(stranger.pid)
        assert pidkill._open({stranger.pid: started + 1}) == {}  # as if the pid had been reused since the scan
        assert is_alive(stranger.pid)
        [pidfd] = pidkill._open({stranger.pid: started}).values()
        if pidfd is not None:
            os.close(pidfd)
    finally:
        stranger.kill()
        stranger.wait()


def test_a_sweep_kills_everything_its_scan_finds_until_it_finds_nothing():
    tree = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '100000'])"])
    try:
        while not reaper.descendants(tree.pid):  # until the child started its own
            time.sleep(0.01)
        [grandchild] = reaper.descendants(tree.pid)
        swept = pidkill.sweep(lambda: [pid for pid in (tree.pid, grandchild) if is_alive(pid)])
        assert swept == pidkill.Swept(killed=tuple(sorted((tree.pid, grandchild))), survivors=())
        assert not is_alive(grandchild)
    finally:
        tree.kill()
        tree.wait()


def test_a_sweep_gives_up_after_its_rounds_not_after_a_time(monkeypatch):
    """A process that will not die (here: its signals are dropped) is reported, after MAX_ROUNDS rounds."""
    survivor = sleeper()
    rounds = []
    monkeypatch.setattr(pidkill, "_kill", lambda pid, pidfd: rounds.append(pid))
    monkeypatch.setattr(pidkill, "MAX_ROUNDS", 3)
    monkeypatch.setattr(pidkill, "ROUND_EXIT_WAIT_S", 0.01)
    try:
        assert pidkill.sweep(lambda: [survivor.pid]) == pidkill.Swept(killed=(survivor.pid,),
                                                                      survivors=(survivor.pid,))
        assert rounds == [survivor.pid] * 3
    finally:
        survivor.kill()
        survivor.wait()


@needs_subreaper
def test_what_ran_before_the_cell_is_not_the_cells(tmp_path):
    earlier = sleeper()
    containment = Containment(use_cgroup=False)
    try:
        with containment.born_inside():
            cell = sleeper()
        containment.spare(cell.pid)
        ended = containment.end()
        assert (ended.mechanism, ended.fallback, ended.killed) == ("subreaper", "$HARNESS_CELL_CGROUP=off", 1)
        assert cell.wait() == -9 and is_alive(earlier.pid)
    finally:
        earlier.kill()
        earlier.wait()


@needs_cgroup
def test_without_cgroup_kill_every_member_is_killed_in_rounds(monkeypatch):
    """Kernels before 5.14 have no cgroup.kill: the members listed in cgroup.procs are killed one by one."""
    monkeypatch.setattr(CellCgroup, "can_kill_whole", property(lambda self: False))
    containment = Containment()
    with containment.born_inside():
        tree = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '100000'])"])
    containment.spare(tree.pid)
    while not reaper.descendants(tree.pid):
        time.sleep(0.01)
    members = containment.cgroup.pids()
    ended = containment.end()
    assert len(members) == 2 and (ended.mechanism, ended.killed, ended.survivors) == ("cgroup", 2, [])
    assert tree.wait() == -9 and not containment.cgroup.path.exists()


@needs_cgroup
def test_a_cgroup_this_process_cannot_enter_gives_way_to_the_subreaper(monkeypatch):
    def refuse(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(CellCgroup, "enter", refuse)
    containment = Containment()
    made = containment.cgroup.path
    with containment.born_inside():
        cell = sleeper()
    containment.spare(cell.pid)
    ended = containment.end()
    assert ended.mechanism == "subreaper" and ended.fallback.startswith(f"cannot move a process into {made}")
    assert cell.wait() == -9 and not made.exists()


ORPHANS = """
import os, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
for _ in range(20):  # each grandchild outlives its parent, is adopted by the containment's process, and exits
    if os.fork() == 0:
        if os.fork() == 0:
            os._exit(0)
        os._exit(0)
    os.wait()
(folder / "orphaned").touch()
while not (folder / "go").exists():
    time.sleep(0.01)
"""


@needs_subreaper
def test_a_cells_dead_orphans_are_collected_while_it_runs_not_only_at_its_end(tmp_path):
    """A cell whose processes leave orphans that exit (a fork chain leaves one a copy) would fill the host's pid
    space with zombies if they waited for the cell's end: wait() collects them as an init does."""
    import threading

    before = reaper.children(os.getpid())  # another test's, not this cell's
    containment = Containment(use_cgroup=False)
    try:
        with containment.born_inside():
            process = subprocess.Popen([sys.executable, "-c", ORPHANS, str(tmp_path)])
        containment.spare(process.pid)
        waiting = threading.Thread(target=containment.wait, args=(process,), daemon=True)
        waiting.start()
        deadline = time.monotonic() + 120  # bounds the failure only: a pass ends at the next collection
        while not (tmp_path / "orphaned").exists() or zombies(os.getpid(), spare=before | {process.pid}):
            assert time.monotonic() < deadline, f"zombies left while the cell ran: {zombies(os.getpid(), before)}"
            time.sleep(0.05)
        (tmp_path / "go").touch()
        waiting.join(timeout=120)
        assert process.returncode == 0
    finally:
        containment.end()


def zombies(parent: int, spare: set[int]) -> set[int]:
    return {pid for pid in reaper.children(parent) - spare
            if (state := pidkill.process_state(pid)) is not None and state[0] == "Z"}
