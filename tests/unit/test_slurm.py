"""Cells across hosts on a real Slurm: 4 hosts in network namespaces (slurm_cluster.py), `harness run` on the
login node submitting the cell, the suite in slurm_suite/ placing ranks on every host. Then each way a host
can break while ranks wait in a call: SIGKILL of everything on a host, a partition, scancel, NODE_FAIL and
harness itself interrupted; each must leave an errored folder naming the cause (and the host) and nothing
running on any host. Skipped where namespaces or root are missing; CI has both (.ci/run installs Slurm).

Waits are on progress (the ranks' marker files, the harness process ending), never on a fixed clock; the
bounds are guards against a hang, far above what the work takes."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, why_not_here

HOSTS = 4
RANKS_PER_HOST = 2
SUITE = Path(__file__).parent / "slurm_suite" / "test_across_hosts.py"
# The installed releases: the cell reuses this interpreter (no environment is built on the hosts).
TORCH, TRANSFORMERS = (importlib.metadata.version(name).split("+")[0] for name in ("torch", "transformers"))
CELL = f"cpu-slurm-{HOSTS}x{RANKS_PER_HOST}rank-torch{TORCH}-tf{TRANSFORMERS}"
HANG_GUARD_S = 480  # a cell that has not ended by now is itself the failure
SLURM_PROCESSES = {"slurmd", "slurmstepd"}

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster():
    reason = why_not_here()
    if reason:
        pytest.skip(f"no Slurm cluster here: {reason}")
    cluster = SlurmCluster.up(HOSTS, Path("/run/harness-slurm-tests"))
    yield cluster
    cluster.down()


def start_cell(cluster: SlurmCluster, tmp_path: Path, *pytest_args: str, environ: dict | None = None):
    matrix = tmp_path / "cpu-4host.yaml"
    matrix.write_text(f"""description: the cross-host suite on {HOSTS} Slurm hosts
axes: {{gpu: [cpu-slurm], hosts: [{HOSTS}], gpus: [{RANKS_PER_HOST}], torch: ["{TORCH}"],
       transformers: ["{TRANSFORMERS}"]}}
suite: [{SUITE}]
timeout_minutes: 8
""")
    log = (tmp_path / "harness.log").open("w")
    command = cluster.login_command(sys.executable, "-m", "harness", "run", "--matrix", str(matrix),
                                    "--results", str(tmp_path / "results"), "--", *pytest_args)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(environ or {})},
                               cwd=Path(__file__).parents[2])
    return process, tmp_path / "results" / CELL


def wait_for(condition, process: subprocess.Popen, what: str, log: Path) -> None:
    """Until `condition()`; fails at once if the harness process ended first."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"harness ended ({process.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, f"{what}: not after {HANG_GUARD_S}s"
        time.sleep(0.2)


def leftovers(cluster: SlurmCluster) -> dict[int, list[str]]:
    """Per host, every process but Slurm's own daemons."""
    found = {}
    for host in range(1, HOSTS + 1):
        rest = []
        for pid in cluster.pids(host):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            if comm not in SLURM_PROCESSES:
                rest.append(f"{pid} {cmdline[:160]}")
        found[host] = rest
    return found


def assert_nothing_left(cluster: SlurmCluster) -> None:
    """Nothing of the cell on any host, once the harness process returned (which waited for Slurm)."""
    deadline = time.monotonic() + 60
    while any(leftovers(cluster).values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = leftovers(cluster)
    print(f"  processes on h1..h{HOSTS} afterwards, Slurm's daemons aside: {left}")
    assert left == {host: [] for host in range(1, HOSTS + 1)}
    assert cluster.login("squeue", "-h").stdout.strip() == ""


def finish(process: subprocess.Popen, folder: Path) -> dict:
    process.wait(timeout=HANG_GUARD_S)
    return json.loads((folder / "env.json").read_text())


def test_world_8_over_4_hosts_passes_with_every_host_named(cluster, tmp_path):
    """Ranks on every host see their own host; a rank hung on host h3 comes back with its stack."""
    started = time.monotonic()
    process, folder = start_cell(cluster, tmp_path, "-k", "ranks_land or hung_ranks_stack")
    env = finish(process, folder)
    log = (tmp_path / "harness.log").read_text()
    assert process.returncode == 0, log[-3000:]
    assert env["status"] == "passed" and env["engine"] == "slurm"
    assert env["hosts"] == [f"h{i}" for i in range(1, HOSTS + 1)] and env["job_id"].isdigit()
    junit = (folder / "junit.xml").read_text()
    assert junit.count("<testcase") == 4 and 'failures="0"' in junit and 'errors="0"' in junit
    assert all(f"[h{i}] " in log for i in range(1, HOSTS + 1))  # every host's output, with its name
    assert "--no-requeue" in log and "--kill-on-bad-exit=1" in (folder / "job.sh").read_text()
    # The hosts were handed the cell's credentials as a file, named in job.sh, gone with the job; no key in any
    # environment (the old HARNESS_HOSTS_KEY is no more), log or file of the results folder.
    credentials = Path((folder / "job.sh").read_text().split("--credentials=")[1].split()[0])
    assert credentials.parent.parent == Path(__file__).parents[2] / ".harness-private" and not credentials.exists()
    for path in [tmp_path / "harness.log", *(path for path in folder.rglob("*") if path.is_file())]:
        text = path.read_bytes()
        assert b"PRIVATE KEY" not in text and b"HARNESS_HOSTS_KEY" not in text, path
    print(f"world 2/4/8 over {HOSTS} Slurm hosts and a hung rank on h3: 4 passed in "
          f"{time.monotonic() - started:.1f}s")
    assert_nothing_left(cluster)


def break_while_waiting(cluster: SlurmCluster, tmp_path: Path, breaking, expected: str,
                        kind: str | None = None) -> dict:
    """Start the cell's waiting case, break something once all 8 ranks wait, and read the folder: errored, saying
    `expected`, and of the error kind `kind` (what triage reads) where given."""
    markers = tmp_path / "markers"
    markers.mkdir()
    process, folder = start_cell(cluster, tmp_path, "-k", "a_host_breaks",
                                 environ={"HARNESS_TEST_MARKERS": str(markers)})
    wait_for(lambda: len(list(markers.iterdir())) == HOSTS * RANKS_PER_HOST, process, "every rank waits",
             tmp_path / "harness.log")
    broken_at = time.time()
    breaking(process)
    env = finish(process, folder)
    lost = folder / "host-lost.json"
    detected = f"; host-lost.json {lost.stat().st_mtime - broken_at:.1f}s after" if lost.is_file() else ""
    print(f"{expected}: {env['error']!r}; harness returned {time.time() - broken_at:.1f}s after{detected}")
    assert env["status"] == "errored", env
    assert expected in (env["error"] or ""), env["error"]
    assert kind is None or env["error_kind"] == kind, env["error_kind"]
    assert_nothing_left(cluster)
    return env


def job_id(cluster: SlurmCluster) -> str:
    return cluster.login("squeue", "-h", "-o", "%i").stdout.split()[0]


def test_sigkill_of_a_host_names_it(cluster, tmp_path):
    def kill_h3(process):
        for pid in cluster.pids(3):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm not in SLURM_PROCESSES:
                os.kill(pid, signal.SIGKILL)

    break_while_waiting(cluster, tmp_path, kill_h3, "host 2 (h3)")


def test_partition_of_a_host_names_it(cluster, tmp_path):
    lost = tmp_path / "results" / CELL / "host-lost.json"

    def cut_h3(process):
        cluster.partition(3, cut=True)
        try:
            wait_for(lost.is_file, process, "host 0 names the lost host", tmp_path / "harness.log")
        finally:
            cluster.partition(3, cut=False)

    env = break_while_waiting(cluster, tmp_path, cut_h3, "host 2 (h3) lost: no heartbeat", "host_lost")
    assert json.loads(lost.read_text())["hostname"] == "h3" and env["exit_code"] != 0


def test_scancel_leaves_a_cancelled_folder(cluster, tmp_path):
    break_while_waiting(cluster, tmp_path, lambda process: cluster.login("scancel", job_id(cluster)),
                        "cancelled (scancel", "interrupted")


def test_harness_interrupted_cancels_its_job(cluster, tmp_path):
    env = break_while_waiting(cluster, tmp_path, lambda process: process.send_signal(signal.SIGTERM),
                              "cancelled: harness interrupted by SIGTERM; slurm job", "interrupted")
    assert env["job_id"] in env["error"]


def test_node_fail_names_the_node(cluster, tmp_path):
    try:
        break_while_waiting(cluster, tmp_path, lambda process: cluster.login(
            "scontrol", "update", "NodeName=h3", "State=DOWN", "Reason=harness-test"), "NODE_FAIL: host h3",
            "host_lost")
    finally:
        cluster.login("scontrol", "update", "NodeName=h3", "State=RESUME", check=False)
