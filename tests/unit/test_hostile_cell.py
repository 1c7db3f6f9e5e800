"""A cell's code that hides processes from the cell's end: a rank that starts a daemon which double-forks out
of the process tree, calls setsid (out of pytest's process group) and clears its environment (no
HARNESS_CELL_TOKEN), and the same daemon on the hosts of a cell across hosts (`harness host`, host 0 and an
agent). Each must be gone when the cell ends, under the cell's cgroup and under the child subreaper that replaces
it where the host offers no cgroup (HARNESS_CELL_CGROUP=off), and env.json must say which of them ended the
cell. And a daemon that forks a fresh copy of itself and exits, over and over, which a kill by scanned pid
races: the cell's cgroup ends it at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from process_helpers import REPO, cgroup_unavailable, host_0_environ, is_alive, start_agent

from harness.containment import cgroup, reaper
from harness.containment.containment import Containment
from harness.engines import credentials

pytest.importorskip("torch")
TORCH, TRANSFORMERS = (__import__("importlib.metadata").metadata.version(name).split("+")[0]
                       for name in ("torch", "transformers"))
HANG_GUARD_S = 240  # a cell that has not ended by now is itself the failure


MECHANISMS = [
    pytest.param("cgroup", marks=pytest.mark.skipif(bool(cgroup_unavailable()), reason=f"{cgroup_unavailable()}")),
    pytest.param("subreaper", marks=pytest.mark.skipif(not reaper.adopt_orphans(False),
                                                       reason="needs PR_SET_CHILD_SUBREAPER (Linux)")),
]
CGROUP_SETTING = {"cgroup": "auto", "subreaper": "off"}

# Started by a rank with an empty environment; it double-forks, the middle process calling setsid, and the
# daemon writes its pid and sleeps. Its parents exit at once: it is nobody's child but a subreaper's.
DAEMON = """
import os, sys
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
with open(sys.argv[1], "w") as record:
    record.write(str(os.getpid()))
os.execve("/bin/sleep", ["sleep", "100000"], {})
"""

# Forks a fresh copy of itself and exits, over and over, each copy in a new session: the pid a scan of /proc
# finds is gone by the time a signal for it is sent. Stops when the stop file appears (the test's cleanup).
HOPPER = """
import os, sys
stop, record = sys.argv[1], sys.argv[2]
with open(record, "w") as written:
    written.write(str(os.getpid()))
while not os.path.exists(stop):
    if os.fork():
        os._exit(0)
    os.setsid()
"""

SUITE = """
import os
import subprocess
import sys
import time
from pathlib import Path


def test_a_rank_leaves_a_daemon_behind(ranks):
    ranks.run(2, start_daemon_on_rank_0, os.environ["DAEMON"], os.environ["ESCAPED_PID_FILE"])


def start_daemon_on_rank_0(script, record):
    import torch.distributed as dist

    if dist.get_rank() == 0:
        # A fresh interpreter with an empty environment: no HARNESS_CELL_TOKEN, nothing to find it by.
        subprocess.run([sys.executable, "-c", script, record], env={}, check=True)
        while not Path(record).exists() or not Path(record).read_text():
            time.sleep(0.05)
"""


def run_cell(tmp_path: Path, environ: dict[str, str]) -> tuple[subprocess.CompletedProcess, dict]:
    """`harness run` on a one-cell CPU matrix (2 ranks) running SUITE; its process and env.json."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_escape.py").write_text(SUITE)
    matrix = tmp_path / "escape.yaml"
    matrix.write_text(textwrap.dedent(f"""
        axes: {{gpu: [cpu], gpus: [2], torch: ["{TORCH}"], transformers: ["{TRANSFORMERS}"]}}
        suite: ["{suite}"]
        timeout_minutes: 4
    """))
    environ = {**os.environ, **environ,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "harness", "run", "--matrix", str(matrix), "--results",
                           str(tmp_path / "results"), "--env-dir", str(tmp_path / "envs")],
                          env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S)
    [folder] = (tmp_path / "results").iterdir()
    return done, json.loads((folder / "env.json").read_text())


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_daemon_a_rank_started_outside_the_tree_and_without_the_token_ends_with_the_cell(tmp_path, mechanism):
    record = tmp_path / "escaped.pid"
    done, env = run_cell(tmp_path, {"DAEMON": DAEMON, "ESCAPED_PID_FILE": str(record),
                                    cgroup.CGROUP_ENV: CGROUP_SETTING[mechanism]})
    escaped = int(record.read_text())
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert not is_alive(escaped), f"pid {escaped} outlived its cell"
        assert env["cleanup"]["mechanism"] == mechanism, env["cleanup"]
        assert env["cleanup"]["killed"] >= 1  # the daemon was still running when the cell ended
        assert env["cleanup"]["survivors"] == []
        assert (env["cleanup"]["fallback"] is None) is (mechanism == "cgroup")
        # the cell's own cgroup went with it (not the whole listing: another run on this machine may have cells)
        assert (env["cleanup"]["cgroup"] is not None) is (mechanism == "cgroup")
        assert env["cleanup"]["cgroup"] is None or not Path(env["cleanup"]["cgroup"]).exists()
    finally:
        if is_alive(escaped):
            os.kill(escaped, signal.SIGKILL)


def hoppers(marker: str) -> list[int]:
    """Live processes whose command line carries `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if marker.encode() in (entry / "cmdline").read_bytes() and is_alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(bool(cgroup_unavailable()), reason=f"{cgroup_unavailable()}")
def test_a_daemon_that_keeps_forking_away_ends_with_the_cells_cgroup_at_once(tmp_path):
    """A scan of /proc finds a pid the hopper has already left: a kill by pid races it, cgroup.kill does not."""
    stop, record = tmp_path / f"stop-{uuid.uuid4().hex}", tmp_path / "hopper.pid"
    containment = Containment()
    try:
        with containment.born_inside():
            subprocess.run([sys.executable, "-c", HOPPER, str(stop), str(record)], env={}, check=True)
        while not record.exists() or not record.read_text():
            time.sleep(0.05)
        ended = containment.end()
        # A copy between its fork and its parent's exit can hide from one scan; three in a row cannot all miss it.
        assert [hoppers(str(stop)) for _ in range(3)] == [[], [], []], "the hopping daemon outlived its cell"
        assert (ended.mechanism, ended.survivors) == ("cgroup", [])
        assert ended.killed >= 1
    finally:
        containment.end()
        stop.write_text("")  # a copy that escaped stops at its next hop
        deadline = time.monotonic() + 60
        while hoppers(str(stop)) and time.monotonic() < deadline:
            time.sleep(0.1)


# Writes itself into the cgroup harness runs in (a process of the cell's user may: harness itself moves between
# the two), then double-forks away like DAEMON.
LEAVER = """
import os, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))
os.execv(sys.executable, [sys.executable, "-c", sys.argv[2], sys.argv[3]])
"""


@pytest.mark.skipif(bool(cgroup_unavailable()), reason=f"{cgroup_unavailable()}")
def test_a_daemon_that_left_the_cells_cgroup_is_still_ended_as_a_descendant(tmp_path):
    record = tmp_path / "escaped.pid"
    containment = Containment()
    try:
        with containment.born_inside():
            subprocess.run([sys.executable, "-c", LEAVER, str(containment.cgroup.parent), DAEMON, str(record)],
                           env={}, check=True)
        while not record.exists() or not record.read_text():
            time.sleep(0.05)
        escaped = int(record.read_text())
        assert escaped not in containment.cgroup.pids()  # out of the cgroup: cgroup.kill alone would miss it
        ended = containment.end()
        assert not is_alive(escaped), "the daemon that left the cgroup outlived its cell"
        # Killed: the daemon, and its parents where they had not finished exiting.
        assert (ended.mechanism, ended.survivors) == ("cgroup", []) and ended.killed >= 1
    finally:
        containment.end()
        if record.exists() and record.read_text() and is_alive(int(record.read_text())):
            os.kill(int(record.read_text()), signal.SIGKILL)


# ------------------------------------------------------------------- the hosts of a cell across hosts


HOST_0_COMMAND = """
import os, subprocess, sys, time
subprocess.run([sys.executable, "-c", os.environ["DAEMON"], os.environ["ESCAPED_PID_FILE"]], env={}, check=True)
while not os.path.exists(os.environ["ESCAPED_PID_FILE"]) or not open(os.environ["ESCAPED_PID_FILE"]).read():
    time.sleep(0.05)
"""


def host_environ(mechanism: str, **extra: str) -> dict[str, str]:
    return {**os.environ, cgroup.CGROUP_ENV: CGROUP_SETTING[mechanism],
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **extra}


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_host_0_of_a_cell_across_hosts_ends_a_daemon_its_pytest_left(tmp_path, mechanism):
    record = tmp_path / "escaped.pid"
    environ = host_environ(mechanism, DAEMON=DAEMON, ESCAPED_PID_FILE=str(record))
    cell = credentials.write(tmp_path / "private", "daemon-on-host-0")
    done = subprocess.run([sys.executable, "-m", "harness", "host", "--index=0", "--count=2", "--host0=127.0.0.1",
                           "--hub-port=1", "--ranks-per-host=1", f"--credentials={cell}", "--", sys.executable, "-c",
                           HOST_0_COMMAND],
                          env=environ, capture_output=True, text=True, timeout=HANG_GUARD_S)
    escaped = int(record.read_text())
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert not is_alive(escaped), f"pid {escaped} outlived host 0's part of the cell"
        assert f"the cell's processes ended through: {mechanism}" in done.stdout, done.stdout
    finally:
        if is_alive(escaped):
            os.kill(escaped, signal.SIGKILL)


def start_daemon_on_rank_1(script: str, record: str) -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        subprocess.run([sys.executable, "-c", script, record], env={}, check=True)
        while not Path(record).exists() or not Path(record).read_text():
            time.sleep(0.05)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_an_agent_of_a_cell_across_hosts_ends_a_daemon_its_rank_left(tmp_path, monkeypatch, mechanism):
    """Two 'hosts' on this one: this process is host 0's pytest (its pool and hub), `harness host --index=1` the
    agent that forks rank 1. The rank starts the daemon; when host 0 closes, the agent must end it."""
    from harness.ranks import ports
    from harness.ranks.pool import PoolLauncher

    record, log = tmp_path / "escaped.pid", tmp_path / "agent.log"
    port, cell = ports.port_outside_ephemeral_range("127.0.0.1"), credentials.write(tmp_path / "private", "daemon")
    for name, value in host_0_environ(port, cell).items():
        monkeypatch.setenv(name, value)
    agent = start_agent(1, port, cell, log, **{cgroup.CGROUP_ENV: CGROUP_SETTING[mechanism]})
    pool = PoolLauncher()
    try:
        pool(2, start_daemon_on_rank_1, DAEMON, str(record), device="cpu", timeout=HANG_GUARD_S)
        escaped = int(record.read_text())
        pool.close()  # host 0's pytest ends: the agent stops and ends what its host ran
        agent.wait(timeout=HANG_GUARD_S)
        assert not is_alive(escaped), f"pid {escaped} outlived its agent:\n{log.read_text()}"
        assert f"the cell's processes ended through: {mechanism}" in log.read_text(), log.read_text()
    finally:
        pool.close()
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if record.exists() and record.read_text() and is_alive(int(record.read_text())):
            os.kill(int(record.read_text()), signal.SIGKILL)


def test_descendants_lists_the_whole_tree_below_a_process():
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                              "subprocess.run(['sleep', '100000'])"])
    try:
        while not reaper.descendants(child.pid):  # until the child started its own
            time.sleep(0.05)
        [grandchild] = reaper.descendants(child.pid)
        assert {child.pid, grandchild} <= reaper.descendants(os.getpid())
    finally:
        child.kill()
        child.wait()
