"""The Slurm engine's pure parts (job script, sbatch line, scontrol parsing, the cause of an errored job) and
the cross-host hub's (who is named lost, the environment a rank on another host sees), without a cluster:
test_slurm.py runs them against a real one; test_hostile_hosts.py plays the network against the hub."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import contract
from harness.engines import check_settings, slurm
from harness.errors import ConfigError
from harness.plan.matrix import expand
from harness.plan.runners import read_runners
from harness.ranks import hosts, ports
from harness.ranks.hostenv import for_host, portable

pytest_plugins = ["pytester"]

RUNNERS = {"cpu": {"labels": ["ubuntu-latest"], "gpus": 0, "ranks": 4},
           "cpu-slurm": {"labels": ["slurm-login"], "gpus": 0, "ranks": 2, "engine": "slurm", "hosts": 4,
                         "submit": {"partition": "ci", "sbatch_args": ["--exclusive"]}},
           "gb200": {"labels": ["gpu-gb200"], "gpus": 4, "engine": "slurm", "hosts": 18,
                     "submit": {"partition": "gb", "account": "ml", "time": "01:00:00", "segment": 18,
                                "container_image": "nvcr.io#pytorch"}}}


def runners(tmp_path: Path, entries: dict = RUNNERS):
    path = tmp_path / "runners.yaml"
    path.write_text(json.dumps(entries))
    return read_runners(path)


def spec(gpu: str, hosts: list[int], gpus: int = 2) -> dict:
    return {"axes": {"gpu": [gpu], "hosts": hosts, "gpus": [gpus], "torch": ["2.13.0"],
                     "transformers": ["5.24.0"]}}


def test_a_cell_spans_hosts_and_its_id_says_so(tmp_path):
    cells = expand(spec("cpu-slurm", [1, 4]), runners(tmp_path), name="m", source="m.yaml")
    assert [cell.id for cell in cells] == ["cpu-slurm-2rank-torch2.13.0-tf5.24.0",
                                           "cpu-slurm-4x2rank-torch2.13.0-tf5.24.0"]
    assert [cell.world_size for cell in cells] == [2, 8] and all(cell.is_cpu for cell in cells)
    assert cells[1].engine == "slurm" and slurm.SlurmSettings.parse(cells[1].submit).partition == "ci"
    gb200 = expand(spec("gb200", [18], gpus=4), runners(tmp_path), name="m", source="m.yaml")[0]
    assert gb200.id == "gb200-18x4gpu-torch2.13.0-tf5.24.0" and not gb200.is_cpu
    # A matrix without a hosts axis keeps today's cells (and ids).
    plain = expand({"axes": {k: v for k, v in spec("cpu", [1])["axes"].items() if k != "hosts"}},
                   runners(tmp_path), name="m", source="m.yaml")[0]
    assert plain.id == "cpu-2rank-torch2.13.0-tf5.24.0" and plain.hosts == 1 and plain.engine == "local"


@pytest.mark.parametrize(("entries", "axes_hosts", "message"), [
    ({**RUNNERS, "x": {"labels": ["l"], "gpus": 1, "engine": "pbs"}}, [1], "x.engine: 'pbs'"),
    ({**RUNNERS, "x": {"labels": ["l"], "gpus": 1, "submit": {"partition": {"a": 1}}}}, [1], "x.submit.partition"),
    (RUNNERS, [8], "hosts 8 for gpu 'cpu-slurm': its runner spans at most 4 hosts"),
    (RUNNERS, [0], "axes.hosts: 0"),
])
def test_bad_hosts_and_engines_name_the_key(tmp_path, entries, axes_hosts, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        expand(spec("cpu-slurm", axes_hosts), runners(tmp_path, entries), name="m", source="m.yaml")


SLURM_X = {"labels": ["l"], "gpus": 1, "engine": "slurm"}


@pytest.mark.parametrize(("runner", "message"), [
    ({**SLURM_X, "submit": {"partiton": "a"}}, "runners.yaml: x.submit: unknown key 'partiton' (known: account, "),
    ({**SLURM_X, "submit": {"sbatch_args": ["-N 2"]}}, "x.submit.sbatch_args: expected a word without spaces"),
    ({**SLURM_X, "submit": {"sbatch_args": ["-N"]}}, "x.submit.sbatch_args: expected a list of --options"),
    ({**SLURM_X, "submit": {"partition": "a b"}}, "x.submit.partition: expected a word"),
    ({**SLURM_X, "submit": {"segment": 0}}, "x.submit.segment: expected a whole number >= 1"),
    ({**SLURM_X, "engine": "jobset", "submit": {"partition": "a"}},
     "x.submit: unknown key 'partition' (known: gpu_resource, hub_port, image, namespace, results_claim)"),
    ({"labels": ["l"], "gpus": 1, "submit": {"partition": "a"}}, "x.submit: the local engine takes no submit:"),
    ({**SLURM_X, "engine": "jobset", "submit": {"hub_port": 70000}}, "x.submit.hub_port: expected a TCP port"),
    ({**SLURM_X, "engine": "jobset", "submit": {"hub_port": "29400"}}, "x.submit.hub_port: expected a whole number"),
])
def test_each_engine_reads_its_own_settings_and_names_the_key(tmp_path, runner, message):
    """The plan keeps `submit:` as written; the runner's engine refuses what is not its own, naming the file."""
    cells = expand({"axes": {"gpu": ["x"], "gpus": [1], "torch": ["2.13.0"], "transformers": ["5.24.0"]}},
                   runners(tmp_path, {"x": runner}), name="m", source="m.yaml")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_settings(cells)


def test_every_engine_runners_yaml_may_name_is_registered():
    """The plan checks `engine:` against ENGINES without importing the engines: the registry has the same names."""
    from harness.engines import REGISTRY
    from harness.plan.cells import ENGINES

    assert tuple(REGISTRY) == ENGINES
    assert all(engine.name == name for name, engine in REGISTRY.items())
    assert [name for name, engine in REGISTRY.items() if engine.runs_here] == ["local"]


def test_job_script_and_sbatch_line(tmp_path):
    cell = expand(spec("gb200", [18], gpus=4), runners(tmp_path), name="m", source="m.yaml")[0]
    script = slurm.batch_script(cell, ["python", "-m", "harness", "host"], tmp_path)
    assert "exec srun --kill-on-bad-exit=1 --nodes=18 --ntasks-per-node=1" in script
    assert "--container-image=nvcr.io#pytorch" in script and f"--output={tmp_path}/host%t.log" in script
    command = slurm.sbatch_command(cell, tmp_path, tmp_path / "job.sh")
    assert command[:2] == ["sbatch", "--parsable"]
    for option in ("--nodes=18", "--ntasks-per-node=1", "--no-requeue", "--gpus-per-node=4", "--partition=gb",
                   "--account=ml", "--time=01:00:00", "--segment=18"):
        assert option in command
    cpu = expand(spec("cpu-slurm", [4]), runners(tmp_path), name="m", source="m.yaml")[0]
    assert "--exclusive" in slurm.sbatch_command(cpu, tmp_path, tmp_path / "job.sh")
    assert not any(arg.startswith("--gpus") for arg in slurm.sbatch_command(cpu, tmp_path, tmp_path / "job.sh"))


def test_scontrol_show_job_parses():
    text = ("JobId=7 JobName=harness-x UserId=root(0) JobState=NODE_FAIL Reason=NodeDown Dependency=(null) "
            "ExitCode=0:9 NodeList=h[1-4] BatchHost=h1")
    state = slurm.parse_job(text, lambda nodes: ["h1", "h2", "h3", "h4"] if nodes == "h[1-4]" else [])
    assert state == slurm.JobState(state="NODE_FAIL", hosts=("h1", "h2", "h3", "h4"), exit_code=0,
                                   reason="NodeDown")
    assert slurm.parse_job("JobState=PENDING NodeList=(null)", lambda n: [n]).hosts == ()


class FakeClient:
    def __init__(self, down=()):
        self.down = list(down)

    def down_hosts(self, hosts):
        return [host for host in hosts if host in self.down]


def job(state: str) -> slurm.JobState:
    return slurm.JobState(state=state, hosts=("h1", "h2", "h3", "h4"), exit_code=1, reason="")


def said(cause) -> tuple[str, str] | None:
    return None if cause is None else (cause.kind, cause.words)


def test_the_first_cause_wins_and_each_is_typed(tmp_path):
    """Each cause carries its kind, as the engine saw it (what triage reads); the words are for people."""
    lost = tmp_path / "host-lost.json"
    assert slurm.job_cause(FakeClient(), job("COMPLETED"), tmp_path, "7") is None
    (tmp_path / "slurm.log").write_text("srun: error: h1: task 0: Exited with exit code 1\n"
                                        "srun: error: h3: task 2: Killed\n")
    # an agent's task ended: the engine saw that, not why (the OOM killer, a crash of the code under test)
    assert said(slurm.job_cause(FakeClient(), job("FAILED"), tmp_path, "7")) == \
        ("engine", "host 2 (h3) ended first: Killed")
    lost.write_text(json.dumps({"host": 2, "hostname": "h3", "reason": "no heartbeat for 10.1s"}))
    assert said(slurm.job_cause(FakeClient(), job("FAILED"), tmp_path, "7")) == \
        ("host_lost", "host 2 (h3) lost: no heartbeat for 10.1s")
    assert said(slurm.job_cause(FakeClient(["h3"]), job("NODE_FAIL"), tmp_path, "7")) == \
        ("host_lost", "Slurm NODE_FAIL: host h3 failed (job 7)")
    # srun's own word first: the other hosts' tasks were terminated because of it.
    (tmp_path / "slurm.log").write_text("srun: error: Node failure on h3\nsrun: error: h2: task 1: Terminated\n")
    assert str(slurm.job_cause(FakeClient(["h2"]), job("NODE_FAIL"), tmp_path, "7", dropped=["h2"])) == \
        "Slurm NODE_FAIL: host h3 failed (job 7)"
    (tmp_path / "slurm.log").unlink()
    # The node that left the job's NodeList while it completed is named, even back up by now.
    assert str(slurm.job_cause(FakeClient(), job("NODE_FAIL"), tmp_path, "7", dropped=["h3"])) == \
        "Slurm NODE_FAIL: host h3 failed (job 7)"
    # An ended job may list no nodes: the hosts seen while it ran are asked about.
    ended = slurm.JobState(state="NODE_FAIL", hosts=(), exit_code=None, reason="")
    assert str(slurm.job_cause(FakeClient(["h3"]), ended, tmp_path, "7", ("h1", "h3"))) == \
        "Slurm NODE_FAIL: host h3 failed (job 7)"
    # scancel stops every agent at once: their closed connections are collateral, not the cause.
    cancelled = slurm.job_cause(FakeClient(), job("CANCELLED"), tmp_path, "7")
    assert cancelled.kind == "interrupted" and cancelled.words.startswith("job 7 cancelled (scancel")
    lost.write_text("[not json")
    assert said(slurm.job_cause(FakeClient(), job("FAILED"), tmp_path, "7")) == \
        ("host_lost", "a host was lost (host-lost.json unreadable)")
    lost.unlink()
    assert said(slurm.job_cause(FakeClient(), None, tmp_path, "7")) == \
        ("engine", "job 7 vanished from Slurm before it ended")
    # Slurm's own end states: a time limit and the OOM kill are the cell's (the code under test), the others not.
    kinds = {state: slurm.job_cause(FakeClient(), job(state), tmp_path, "7").kind
             for state in ("TIMEOUT", "DEADLINE", "OUT_OF_MEMORY", "BOOT_FAIL", "PREEMPTED")}
    assert kinds == {"TIMEOUT": "timeout", "DEADLINE": "timeout", "OUT_OF_MEMORY": "signal", "BOOT_FAIL": "host_lost",
                     "PREEMPTED": "interrupted"}
    assert all(kind in contract.ERROR_KINDS for kind in kinds.values())


def test_host_logs_stream_with_the_host_name(tmp_path):
    lines = []
    streamer = slurm.LogStreamer(tmp_path, lines.append)
    (tmp_path / "host0.log").write_text("one\ntw")
    (tmp_path / "host1.log").write_text("agent\n")
    streamer.poll(("h1", "h2"))
    with (tmp_path / "host0.log").open("a") as log:
        log.write("o\nend")
    streamer.poll(("h1", "h2"), final=True)
    assert lines == ["[h1] one", "[h2] agent", "[h1] two", "[h1] end"]


# ---------------------------------------------------------------- the hub (host 0's side of the agents)


def link(host: int, last_seen: float, closed_at: float | None = None):
    return SimpleNamespace(host=host, hostname=f"h{host + 1}", last_seen=last_seen, closed_at=closed_at)


def test_the_host_that_went_silent_first_is_named_not_the_first_closed():
    now = 100.0
    assert hosts.first_lost([link(1, 99.5), link(2, 99.0)], now) is None
    # A partitioned host 2 stopped at 95; host 3's connection broke at 99 because of it.
    lost = hosts.first_lost([link(1, 99.5), link(2, 95.0), link(3, 98.9, closed_at=99.0)], now)
    assert (lost.host, lost.hostname) == (2, "h3") and "no heartbeat" in lost.reason
    # A host killed outright: its connection closed while it was still beating.
    lost = hosts.first_lost([link(1, 99.5), link(3, 99.6, closed_at=99.7)], now)
    assert lost.host == 3 and "connection closed" in lost.reason
    lost = hosts.first_lost([link(1, 99.5), link(2, 89.0)], now)
    assert lost.host == 2 and "no heartbeat for 11.0s" in lost.reason


def test_only_the_portable_environment_crosses_hosts():
    host0 = {"SLURM_NODEID": "0", "HOSTNAME": "h1", "TMPDIR": "/tmp/a", "HF_HOME": "/x", "PYTHONPATH": "/p",
             "SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1", "HARNESS_HOSTS_CREDENTIALS": "/job/cell.pem"}
    sent = portable(host0)
    assert sent == {"HF_HOME": "/x", "PYTHONPATH": "/p"}
    host2 = {"SLURM_NODEID": "2", "HOSTNAME": "h3", "TMPDIR": "/tmp/b", "HF_HOME": "/old", "CUDA_VISIBLE_DEVICES": "0"}
    assert for_host(sent, host2) == {"HF_HOME": "/x", "PYTHONPATH": "/p", "SLURM_NODEID": "2", "HOSTNAME": "h3",
                                     "TMPDIR": "/tmp/b", "CUDA_VISIBLE_DEVICES": "0"}


def test_submit_options_are_frozen_and_hashable(tmp_path):
    cell = expand(spec("cpu-slurm", [2]), runners(tmp_path), name="m", source="m.yaml")[0]
    assert hash(cell) and hash(slurm.SlurmSettings.parse(cell.submit))
    assert cell.to_json()["submit"] == {"partition": "ci", "sbatch_args": ["--exclusive"]}


# ---------------------------------------------------------------- a rank's own host


def launch(world_size: int, ranks_per_host: int = 0):
    from harness.ranks.protocol import Launch

    return Launch(world_size=world_size, port=29500, workdir="/tmp", collective_timeout_s=60, device="cpu",
                  launcher_pid=1, master_addr="10.0.0.1" if ranks_per_host else "127.0.0.1",
                  ranks_per_host=ranks_per_host)


@pytest.mark.parametrize(("world", "per_host", "rank", "expected"), [
    (8, 2, 5, {"RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "lo": False}),
    (4, 0, 3, {"RANK": "3", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "lo": True}),
])
def test_a_rank_takes_its_local_rank_and_its_hosts_share_of_threads(monkeypatch, world, per_host, rank, expected):
    import os
    import socket

    from harness.ranks import rank as rank_module

    for name in ("GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(socket, "if_nameindex", lambda: [(1, "lo"), (2, "eth0")])
    before = dict(os.environ)
    try:
        rank_module.set_environment(launch(world, per_host), rank)
        seen = {name: os.environ[name] for name in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")}
        assert seen == {name: value for name, value in expected.items() if name != "lo"}
        assert (os.environ.get("GLOO_SOCKET_IFNAME") == "lo") is expected["lo"]  # lo breaks gloo across hosts
        assert os.environ["OMP_NUM_THREADS"] == str(16 // int(expected["LOCAL_WORLD_SIZE"]))
        assert rank_module.local_rank(launch(world, per_host), rank) == int(expected["LOCAL_RANK"])
    finally:
        os.environ.clear()
        os.environ.update(before)


def test_a_world_takes_the_first_hosts():
    hub = SimpleNamespace(config=SimpleNamespace(ranks_per_host=2), master_addr="10.0.0.1")
    assert hosts.Placement(hub, 8).remote_ranks() == {1: [2, 3], 2: [4, 5], 3: [6, 7]}
    assert hosts.Placement(hub, 2).remote_ranks() == {}
    assert hosts.Placement(hub, 3).remote_ranks() == {1: [2]}


# ---------------------------------------------------------------- GPU memory of every host


def test_every_hosts_gpus_merge_into_memory_json(tmp_path):
    from harness.engines import hostmemory

    def gpu(index, uuid, peak):
        return {"index": index, "name": "NVIDIA GB200", "uuid": uuid, "total_mib": 189471.0,
                "used_before_mib": 600.0, "peak_used_mib": peak, "interval_s": 0.05, "sample_count": 40}

    (tmp_path / "memory.host0.json").write_text(json.dumps(
        {"available": True, "interval_s": 0.05, "sample_count": 40, "gpus": [gpu(0, "GPU-a", 900.0)]}))
    (tmp_path / "memory.host1.json").write_text(json.dumps(
        {"available": True, "interval_s": 0.05, "sample_count": 38,
         "gpus": [gpu(0, "GPU-b", float("nan")), {"uuid": 7}, "junk"]}).replace("NaN", "1e999"))
    (tmp_path / "memory.host2.json").write_text(json.dumps({"available": False, "reason": "NVML: driver not loaded"}))
    report = hostmemory.merge(tmp_path, ["h1", "h2", "h3", "h4"])
    assert report.available and report.sample_count == 38
    assert [(entry.host, entry.gpu.uuid, entry.peak_used_mib) for entry in report.gpus] == \
        [("h1", "GPU-a", 900.0), ("h2", "GPU-b", None)]  # a non-finite number is no number
    assert report.reason == "not reported by h3: NVML: driver not loaded, h4"
    written = report.to_json()["gpus"]
    assert [entry["host"] for entry in written] == ["h1", "h2"]
    assert not hostmemory.merge(tmp_path / "none", ["h1"]).available


def test_ports_for_stores_and_hubs_avoid_the_ephemeral_range():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    chosen = {ports.port_outside_ephemeral_range("127.0.0.1") for _ in range(20)}
    assert all(1024 <= port < low for port in chosen) and len(chosen) > 1


def test_a_cell_across_hosts_refuses_ranks_the_pool_cannot_place(pytester, monkeypatch):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    for name, value in {"HARNESS_HOSTS": "4", "HARNESS_HOST_RANKS": "2", "HARNESS_HUB": "10.0.0.1:20001",
                        "HARNESS_HOSTS_CREDENTIALS": "/nowhere/cell.pem", "HARNESS_RANKS_POOL": "0"}.items():
        monkeypatch.setenv(name, value)
    result = pytester.runpytest_subprocess("-p", "harness.ranks.plugin")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*a cell across hosts places its ranks through the forked rank pool*"])
    monkeypatch.setenv("HARNESS_HUB", "no-port-here")
    monkeypatch.delenv("HARNESS_RANKS_POOL")
    with pytest.raises(ValueError, match=r"needs \$HARNESS_HOSTS"):
        hosts.HostsConfig.from_environment()


# ---------------------------------------------------------------- the cell's credentials


class RecordingSlurm:
    """Answers sbatch, scontrol and squeue as for a job that completed at once; at sbatch, notes what the job
    was handed: its script, its environment, and the credentials file the script names."""

    def __init__(self):
        self.seen: dict = {}

    def __call__(self, *command, check=True, env=None):
        if command[0] == "sbatch":
            script = Path(command[-1]).read_text()
            credentials = Path(script.split("--credentials=")[1].split()[0])
            self.seen = {"script": script, "environ": dict(env), "credentials": credentials,
                         "pem": credentials.read_bytes(), "file_mode": credentials.stat().st_mode & 0o777,
                         "folder_mode": credentials.parent.stat().st_mode & 0o777,
                         "parent_mode": credentials.parent.parent.stat().st_mode & 0o777}
            return "7\n"
        return ""

    def job(self, job_id):
        return slurm.JobState(state="COMPLETED", hosts=("h1", "h2"), exit_code=0, reason="")


def test_each_job_gets_its_own_credentials_as_a_private_file_named_by_path_only(tmp_path):
    cell = expand(spec("cpu-slurm", [2]), runners(tmp_path), name="m", source="m.yaml")[0]
    project, folder = tmp_path / "project", tmp_path / "results" / cell.id
    project.mkdir()
    folder.mkdir(parents=True)
    client, record = RecordingSlurm(), {}
    exit_code, cause = slurm.run_job(cell, folder=folder, pytest_command=["python", "-m", "pytest"],
                                     environ={"PATH": "/usr/bin"}, project=project, log=lambda line: None,
                                     record=record, client=client)
    assert (exit_code, cause, record["job_id"]) == (0, None, "7")
    seen = client.seen
    assert seen["credentials"].parent.parent == project / slurm.PRIVATE_FOLDER  # not in the uploaded results
    assert (seen["file_mode"], seen["folder_mode"], seen["parent_mode"]) == (0o600, 0o700, 0o700)
    assert b"PRIVATE KEY" in seen["pem"] and b"CERTIFICATE" in seen["pem"]
    body = seen["pem"].splitlines()[1].decode()
    assert body not in json.dumps(seen["environ"]) and body not in seen["script"]
    assert not any("KEY" in name for name in seen["environ"])
    assert not seen["credentials"].parent.exists()  # gone with the job
    assert not any(folder.rglob("*.pem"))
    # Two jobs never share credentials.
    slurm.run_job(cell, folder=folder, pytest_command=["python"], environ={}, project=project, log=lambda line: None,
                  record={}, client=client)
    assert client.seen["pem"] != seen["pem"]


def test_a_host_without_its_credentials_file_stops_with_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "harness", "host", "--index", "1", "--count", "2", "--host0",
                             "127.0.0.1", "--hub-port", "20001", "--ranks-per-host", "1",
                             "--credentials", str(tmp_path / "missing.pem")], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith(
        f"harness host: --credentials {tmp_path / 'missing.pem'}: no such file (the engine writes it for the cell)")
