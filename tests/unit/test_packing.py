"""Packing (runners.yaml `pack: true`): first-fit decreasing into hosts, one workflow job per pack, and a local run
of a pack: its cells at once on disjoint GPUs, each folder as if the cell ran alone, a crash or hang ending only
its own cell."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml, module_for_children
from run_helpers import TORCH, TRANSFORMERS, write_packed_matrix

import harness.run.packed
from harness import contract
from harness.cell import gpulock
from harness.cell.gpus import GpuIdentity
from harness.cli import main
from harness.errors import ConfigError
from harness.plan.cells import Cell, Runner
from harness.plan.matrix import load_matrix
from harness.plan.packing import Pack, first_fit_decreasing, job_cells, members, plan_jobs
from harness.plan.runners import load_runners, read_runners
from harness.run.plan import Host, Plan


def cell(gpus: int, gpu: str = "h200", transformers: str = "5.9.0", timeout_minutes: float = 30) -> Cell:
    return Cell(gpu=gpu, gpus=gpus, torch="2.11.0", transformers=transformers, matrix="m", labels=("gpu-h200",),
                timeout_minutes=timeout_minutes, reruns=0, suite=("tests/gpu",))


def shapes(packs: list[Pack]) -> list[list[str]]:
    return [[f"{c.gpus}:{c.transformers}" for c in pack.cells] for pack in packs]


@pytest.mark.parametrize(("cells", "capacity", "expected"), [
    # four 2-GPU cells fill one 8-GPU host
    ([cell(2, transformers=v) for v in "abcd"], 8, [["2:a", "2:b", "2:c", "2:d"]]),
    # biggest first; each into the first host with room: the 1 fills the first host's gap
    ([cell(2, transformers="a"), cell(4, transformers="b"), cell(1, transformers="c"), cell(4, transformers="d"),
      cell(2, transformers="e")], 8, [["4:b", "4:d"], ["2:a", "2:e", "1:c"]]),
    ([cell(8, transformers="a"), cell(1, transformers="b"), cell(8, transformers="c")], 8,
     [["8:a"], ["8:c"], ["1:b"]]),
    ([cell(1, transformers=v) for v in "abc"], 1, [["1:a"], ["1:b"], ["1:c"]]),  # one GPU: one cell a host
])
def test_first_fit_decreasing(cells, capacity, expected):
    packs = first_fit_decreasing(cells, capacity, runner="h200")
    assert shapes(packs) == expected
    assert [pack.id for pack in packs] == [f"h200-pack{k}" for k in range(1, len(expected) + 1)]
    assert all(sum(c.gpus for c in pack.cells) <= capacity for pack in packs)


def test_a_cell_bigger_than_the_host_is_an_error():
    with pytest.raises(ConfigError, match=r"h200-8gpu-torch2\.11\.0-tf5\.9\.0: needs 8 GPUs, one h200 host has 4"):
        first_fit_decreasing([cell(2), cell(8)], 4, runner="h200")


def test_jobs_pack_only_the_runner_types_that_pack_and_stand_where_their_first_cell_stood():
    runners = {"h200": Runner(name="h200", labels=("gpu-h200",), gpus=8, pack=True),
               "ada": Runner(name="ada", labels=("gpu-ada",), gpus=2)}
    cells = [cell(2, gpu="ada"), cell(4, transformers="a"), cell(2, gpu="ada", transformers="b"),
             cell(4, transformers="b"), cell(2, transformers="c")]
    jobs = plan_jobs(cells, runners)
    assert [job.id for job in jobs] == [cells[0].id, "h200-pack1", "h200-pack2", cells[2].id]
    assert [c.id for c in job_cells(jobs, "h200-pack1", "m.yaml")] == [cells[1].id, cells[3].id]
    assert job_cells(jobs, cells[2].id, "m.yaml") == [cells[2]]
    assert members(jobs) == {cells[1].id: "h200-pack1", cells[3].id: "h200-pack1", cells[4].id: "h200-pack2"}
    with pytest.raises(ConfigError, match=r"m\.yaml: no job 'h200-pack9'"):
        job_cells(jobs, "h200-pack9", "m.yaml")


@pytest.mark.parametrize(("entry", "message"), [
    ("{labels: [x], gpus: 8, pack: yes please}", "runners.yaml: h200.pack: expected true or false, got 'yes please'"),
    ("{labels: [x], gpus: 8, pack: 1}", "runners.yaml: h200.pack: expected true or false, got 1"),
    ("{labels: [x], gpus: 0, ranks: 2, engine: slurm, pack: true}",
     "runners.yaml: h200.pack: only a runner with engine: local packs cells on its host; engine slurm"),
    ("{labels: [x], gpus: 8, hosts: 2, pack: true}",
     "runners.yaml: h200.pack: a runner whose cells span 2 hosts cannot pack them on one host"),
])
def test_a_bad_pack_names_the_file_and_key(tmp_path, entry, message):
    path = tmp_path / "runners.yaml"
    path.write_text(f"h200: {entry}\n")
    with pytest.raises(ConfigError, match="^" + str(tmp_path).replace(".", r"\.") + "/" + message.replace(".", r"\.")):
        read_runners(path)


def test_pack_defaults_to_false_and_the_shipped_runners_do_not_pack(tmp_path):
    path = tmp_path / "runners.yaml"
    path.write_text("h200: {labels: [x], gpus: 8}\ncpu: {labels: [y], gpus: 0, ranks: 8, pack: true}\n")
    runners = read_runners(path)
    assert (runners["h200"].pack, runners["cpu"].pack) == (False, True)


def test_github_format_gives_one_job_per_pack_and_unpacked_cells_unchanged(pip_index, tmp_path, capsys):
    matrix = write_packed_matrix(tmp_path / "m", ["tests/gpu"], {"h200": {"labels": ["gpu-h200"], "gpus": 8,
                                                                           "nvml_name": "NVIDIA H200", "pack": True},
                                                                  "ada": {"labels": ["gpu-ada"], "gpus": 8}},
                                 gpus=[2, 4, 8], timeout_minutes=30)
    assert main(["matrix", "--matrix", matrix, "--format", "github"]) == 0
    include = json.loads(capsys.readouterr().out)["include"]
    ids = [f"{gpu}-{n}gpu-torch{TORCH}-tf{TRANSFORMERS}" for gpu, n in
           (("h200", 8), ("h200", 4), ("h200", 2), ("ada", 2), ("ada", 4), ("ada", 8))]
    assert [entry["id"] for entry in include] == ["h200-pack1", "h200-pack2", *ids[3:]]
    pack1, pack2 = include[0], include[1]
    assert (pack1["cells"], pack2["cells"]) == ([ids[0]], [ids[1], ids[2]])
    assert pack2["runs_on"] == ["gpu-h200"] and pack2["gpus"] == 6 and pack2["timeout_minutes"] == 30 + 20
    assert all("cells" not in entry for entry in include[2:])  # an unpacked cell's entry is as before
    assert {"id", "runs_on", "gpus", "torch", "transformers", "timeout_minutes", "matrix"} <= set(include[2])


def test_run_job_runs_the_cells_of_one_pack(tmp_path, capsys, monkeypatch):
    matrix = write_packed_matrix(tmp_path / "m", ["tests/gpu"], {"pa": {"labels": ["x"], "gpus": 0, "ranks": 4,
                                                                         "pack": True}}, gpus=[1, 2, 3])
    monkeypatch.setattr(harness.run.packed, "available_cores", lambda: 4)
    assert main(["run", "--matrix", matrix, "--job", "pa-pack1", "--dry-run"]) == 0
    shown = capsys.readouterr().out  # 4 ranks a host: the 3 first, the 2 does not fit beside it, the 1 does
    ids = {ranks: f"pa-{ranks}rank-torch{TORCH}-tf{TRANSFORMERS}" for ranks in (3, 2, 1)}
    assert [f"{ids[ranks]}\n" in shown for ranks in (3, 2, 1)] == [True, False, True]
    assert f"at once on this machine (runners.yaml pack): {ids[3]}, {ids[1]}\n" in shown
    assert main(["run", "--matrix", matrix, "--job", "pa-pack7", "--dry-run"]) == 2
    assert "no job 'pa-pack7'" in capsys.readouterr().err


def test_run_links_give_each_packed_cell_its_packs_job_and_artifact(fake, env, monkeypatch, tmp_path):
    matrix = write_packed_matrix(tmp_path / "m", ["tests/gpu"], {"pa": {"labels": ["x"], "gpus": 0, "ranks": 4,
                                                                         "pack": True}}, gpus=[1, 3])
    monkeypatch.setenv("GITHUB_RUN_ID", "77")
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    run = f"https://github.com/{os.environ['GITHUB_REPOSITORY']}/actions/runs/77"
    fake.jobs = {77: [{"id": 2, "name": "gpu-tests / pa-pack1", "html_url": f"{run}/job/2"}]}
    fake.artifacts = {77: [{"id": 9, "name": "results-pa-pack1", "expired": False}]}
    out = tmp_path / "links.json"
    assert main(["gh", "run-links", "--matrix", matrix, "-o", str(out)]) == 0
    links = json.loads(out.read_text())
    for ranks in (1, 3):
        cell_id = f"pa-{ranks}rank-torch{TORCH}-tf{TRANSFORMERS}"
        assert (links["jobs"][cell_id], links["artifacts"][cell_id]) == (f"{run}/job/2", f"{run}/artifacts/9")
    assert main(["gh", "run-links", "-o", str(out)]) == 0  # without --matrix: by the jobs' names, as before
    assert set(json.loads(out.read_text())["jobs"]) == {"pa-pack1"}


# Each cell of a pack does what its cell id says. `meet`: wait until every meeting cell of the pack has begun
# (generous deadline): a pack run one cell after another fails here, whatever the machine's speed.
PACKED_SUITE = """
    import json, os, signal, subprocess, sys, time
    from pathlib import Path

    def test_cell():
        cell = os.environ["HARNESS_CELL_ID"]
        meet = Path(os.environ["PACK_MEET_DIR"])
        names = ("CUDA_VISIBLE_DEVICES", "HARNESS_PORT_SLOT", "OMP_NUM_THREADS")
        given = {name: os.environ.get(name) for name in names}
        (meet / cell).write_text(json.dumps(given))
        if cell.startswith("crash"):
            os.kill(os.getpid(), signal.SIGKILL)
        if cell.startswith("hang"):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            (Path(os.environ["CHILD_PID_DIR"]) / cell).write_text(str(child.pid))
            time.sleep(300)
        deadline = time.monotonic() + 120
        while len(list(meet.iterdir())) < int(os.environ["PACK_MEET_COUNT"]):
            assert time.monotonic() < deadline, "the pack's cells did not run at once"
            time.sleep(0.05)
"""


def write_suite(tmp_path: Path, meet_count: int, monkeypatch) -> str:
    suite = tmp_path / "suite_packed"
    suite.mkdir()
    (suite / "test_packed.py").write_text(textwrap.dedent(PACKED_SUITE))
    (tmp_path / "meet").mkdir()
    monkeypatch.setenv("PACK_MEET_DIR", str(tmp_path / "meet"))
    monkeypatch.setenv("PACK_MEET_COUNT", str(meet_count))
    (tmp_path / "children").mkdir()
    monkeypatch.setenv("CHILD_PID_DIR", str(tmp_path / "children"))
    return str(suite)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def ended(env_json: Path) -> bool:
    """The cell's env.json is written and says the cell ended (a run writes it whole, by rename)."""
    return env_json.is_file() and read_json(env_json).get("end") is not None


def test_a_packed_pack_of_four_cpu_cells_runs_at_once_and_a_crash_and_a_hang_end_only_their_own(
        tmp_path, monkeypatch, capsys):
    suite = write_suite(tmp_path, 4, monkeypatch)
    runners = {name: {"labels": ["x"], "gpus": 0, "ranks": 2, "pack": True} for name in ("meet", "crash", "hang",
                                                                                          "meets")}
    matrix = write_packed_matrix(tmp_path / "m", [suite], runners, gpus=[2], timeout_minutes=0.5)
    monkeypatch.setattr(harness.run.packed, "available_cores", lambda: 8)  # 4 cells x 2 ranks fit at once
    results = tmp_path / "results"
    assert main(["run", "--matrix", matrix, "--results", str(results), "--env-dir", str(tmp_path / "envs")]) == 1
    folders = {name: results / f"{name}-2rank-torch{TORCH}-tf{TRANSFORMERS}" for name in runners}
    for folder in folders.values():  # each folder as a cell run alone leaves it
        assert {"env.json", "memory.json", "pytest.log", "install.log"} <= {p.name for p in folder.iterdir()}
        assert read_json(folder / "env.json")["cell"]["id"] == folder.name
    env = {name: read_json(folder / "env.json") for name, folder in folders.items()}
    assert (env["meet"]["status"], env["meets"]["status"]) == ("passed", "passed")
    assert env["crash"]["status"] == "errored" and env["crash"]["error"] == "pytest crashed: killed by signal SIGKILL"
    assert env["hang"]["status"] == "errored" and env["hang"]["error"].startswith("timed out after 0.5 min")
    with pytest.raises(ProcessLookupError):  # the hung cell's own child died with it
        os.kill(int((tmp_path / "children" / folders["hang"].name).read_text()), 0)
    out = capsys.readouterr().out
    assert f"[{folders['meet'].name}] " in out and "== packing 4 cells on this machine at once" in out
    given = [read_json(tmp_path / "meet" / folder.name) for folder in folders.values()]
    assert sorted(each["HARNESS_PORT_SLOT"] for each in given) == ["0/4", "1/4", "2/4", "3/4"]  # no port shared
    assert {each["OMP_NUM_THREADS"] for each in given} == {"1"}  # 8 cores over 4 x 2 ranks


def test_a_pack_on_eight_fake_gpus_gives_each_cell_its_own_gpus_by_uuid(tmp_path, monkeypatch):
    uuids = [f"GPU-{index:08x}-fake" for index in range(8)]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(uuid=uuid) for uuid in uuids]))
    shim = module_for_children(tmp_path / "nvml", uuids)  # the cells' own harness runs see the same 8 GPUs
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(gpulock.LOCK_DIR_ENV, str(tmp_path / "locks"))  # fake UUIDs: no other run's locks
    suite = write_suite(tmp_path, 3, monkeypatch)
    h200 = {"labels": ["gpu-h200"], "gpus": 8, "nvml_name": "NVIDIA H200", "pack": True}
    matrix = write_packed_matrix(tmp_path / "m", [suite], {"h200": h200}, gpus=[1, 2, 4])
    results = tmp_path / "results"
    assert main(["run", "--matrix", matrix, "--results", str(results), "--env-dir", str(tmp_path / "envs")]) == 0
    seen: list[str] = []
    for count in (1, 2, 4):
        folder = results / f"h200-{count}gpu-torch{TORCH}-tf{TRANSFORMERS}"
        env, memory = read_json(folder / "env.json"), read_json(folder / "memory.json")
        own = [gpu["uuid"] for gpu in env["gpus"]]
        assert len(own) == count and [gpu["uuid"] for gpu in memory["gpus"]] == own
        assert read_json(tmp_path / "meet" / folder.name)["CUDA_VISIBLE_DEVICES"] == ",".join(own)  # its pytest's
        assert env["status"] == "passed"
        seen += own
    assert sorted(seen) == sorted(uuids[:7])  # disjoint: 4 + 2 + 1 of the 8


def test_gpu_locks_are_all_or_nothing_and_dropped_on_release(tmp_path, monkeypatch):
    monkeypatch.setenv(gpulock.LOCK_DIR_ENV, str(tmp_path / "locks"))
    first = gpulock.try_lock(["GPU-a", "GPU-b"])
    assert isinstance(first, gpulock.GpuLocks)
    refused = gpulock.try_lock(["GPU-c", "GPU-b"])
    assert refused == f"GPU GPU-b is held by another harness run on this host (lock {tmp_path}/locks/GPU-b.lock)"
    other = gpulock.try_lock(["GPU-c"])  # the refused call kept no lock of GPU-c
    assert isinstance(other, gpulock.GpuLocks)
    first.release()
    assert isinstance(gpulock.try_lock(["GPU-b"]), gpulock.GpuLocks)


def test_a_cell_whose_gpu_another_harness_run_holds_is_errored_busy(tmp_path, monkeypatch):
    uuids = ["GPU-00000000-fake", "GPU-00000001-fake"]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(uuid=uuid) for uuid in uuids]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(gpulock.LOCK_DIR_ENV, str(tmp_path / "locks"))
    suite = write_suite(tmp_path, 1, monkeypatch)
    h200 = {"labels": ["gpu-h200"], "gpus": 2, "nvml_name": "NVIDIA H200"}
    matrix = write_packed_matrix(tmp_path / "m", [suite], {"h200": h200}, gpus=[2])
    held = gpulock.try_lock([uuids[1]])  # as another harness run on this host would
    assert isinstance(held, gpulock.GpuLocks)
    results = tmp_path / "results"
    assert main(["run", "--matrix", matrix, "--results", str(results), "--env-dir", str(tmp_path / "envs")]) == 1
    env = read_json(results / f"h200-2gpu-torch{TORCH}-tf{TRANSFORMERS}" / "env.json")
    assert env["error_kind"] == contract.ERROR_BUSY_GPUS
    assert f"GPU {uuids[1]} is held by another harness run" in env["error"]
    assert not list((tmp_path / "meet").iterdir())  # its pytest never started
    held.release()


def local_plan(tmp_path: Path, host_uuids: list[str], runners: dict[str, dict], gpus: list[int]) -> Plan:
    matrix = load_matrix(write_packed_matrix(tmp_path / "m", ["tests/gpu"], runners, gpus=gpus))
    host = Host(gpus=tuple(GpuIdentity(index=i, uuid=uuid, name="NVIDIA H200") for i, uuid in enumerate(host_uuids)),
                gpu_type="h200", driver=None)
    return Plan(matrix=matrix, cells=matrix.cells, host=host, refused={}, results_root=tmp_path / "results",
                env_dir=tmp_path / "envs", pytest_args=(),
                runners=load_runners(matrix.root, beside=matrix.path.parent))


def round_shapes(rounds: list[tuple[Cell, ...]]) -> list[list[str]]:
    return [[f"{cell.gpu}:{cell.gpus}" for cell in each] for each in rounds]


def test_this_machine_packs_gpu_cells_into_its_gpus_and_cpu_cells_into_its_cores(tmp_path):
    runners = {"h200": {"labels": ["x"], "gpus": 8, "nvml_name": "NVIDIA H200", "pack": True},
               "cpu": {"labels": ["y"], "gpus": 0, "ranks": 8, "pack": True},
               "ada": {"labels": ["z"], "gpus": 8}}
    plan = local_plan(tmp_path, [f"GPU-{i}" for i in range(4)], runners, gpus=[2, 4])
    # 4 GPUs here: the h200 4 and 2 cannot share them; 3 cores: nor the cpu 4 and 2; ada never packs. Each round
    # stands where its first cell stood in the matrix.
    assert round_shapes(harness.run.packed.rounds(plan, cores=3)) == [
        ["h200:2"], ["h200:4"], ["cpu:2"], ["cpu:4"], ["ada:2"], ["ada:4"]]
    assert round_shapes(harness.run.packed.rounds(plan, cores=6)) == [
        ["h200:2"], ["h200:4"], ["cpu:4", "cpu:2"], ["ada:2"], ["ada:4"]]
    wide = local_plan(tmp_path, [f"GPU-{i}" for i in range(8)], runners, gpus=[2, 4])
    assert round_shapes(harness.run.packed.rounds(wide, cores=1))[0] == ["h200:4", "h200:2"]
    environs = harness.run.packed.shares(harness.run.packed.rounds(wide, cores=1)[0], wide.host, cores=12)
    assert [each["CUDA_VISIBLE_DEVICES"] for each in environs] == ["GPU-0,GPU-1,GPU-2,GPU-3", "GPU-4,GPU-5"]
    assert [each["OMP_NUM_THREADS"] for each in environs] == ["2", "2"]  # 12 cores over 6 ranks
    mig = local_plan(tmp_path, [f"MIG-{i}" for i in range(8)], runners, gpus=[2, 4])
    assert round_shapes(harness.run.packed.rounds(mig, cores=1))[:2] == [["h200:2"], ["h200:4"]]  # no NVLink


def start_hanging_pack(tmp_path: Path, monkeypatch) -> tuple[subprocess.Popen, dict[Path, int]]:
    """`harness run` of a pack of two 1-rank cells, once both hang at once: the run, and each cell's folder with the
    pid of the child its test started (read once the test has written it)."""
    suite = write_suite(tmp_path, 2, monkeypatch)
    runners = {name: {"labels": ["x"], "gpus": 0, "ranks": 1, "pack": True} for name in ("hang", "hangs")}
    matrix = write_packed_matrix(tmp_path / "m", [suite], runners, gpus=[1], timeout_minutes=5)
    run = subprocess.Popen([sys.executable, "-m", "harness", "run", "--matrix", matrix, "--results",
                            str(tmp_path / "results"), "--env-dir", str(tmp_path / "envs")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while len(pids := {path.name: path.read_text() for path in (tmp_path / "children").iterdir()}) < 2 or \
            "" in pids.values():
        assert time.monotonic() < deadline and run.poll() is None, "the pack's cells did not both start"
        time.sleep(0.05)
    return run, {tmp_path / "results" / name: int(pid) for name, pid in pids.items()}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a pack of two 1-rank cells needs 2 cores here")
def test_an_interrupted_packed_run_records_each_cell_and_leaves_no_process(tmp_path, monkeypatch):
    run, cells = start_hanging_pack(tmp_path, monkeypatch)
    run.send_signal(signal.SIGTERM)
    output = run.communicate(timeout=180)[0].decode(errors="replace")
    assert run.returncode == 128 + signal.SIGTERM, output
    for folder, child in cells.items():
        env = read_json(folder / "env.json")
        assert (env["status"], env["error_kind"]) == ("errored", contract.ERROR_INTERRUPTED), output
        with pytest.raises(ProcessLookupError):  # nothing of the cell outlives the run
            os.kill(child, 0)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a pack of two 1-rank cells needs 2 cores here")
def test_a_packed_run_killed_by_sigkill_still_has_each_cell_recorded_and_ended(tmp_path, monkeypatch):
    """SIGKILL cannot be caught: each member run, tethered to the packed run, gets SIGTERM when it dies, ends its
    cell and records it interrupted, as if the packed run had passed the signal on itself."""
    run, cells = start_hanging_pack(tmp_path, monkeypatch)
    run.kill()
    output = run.communicate(timeout=60)[0].decode(errors="replace")
    try:
        for folder, child in cells.items():
            deadline = time.monotonic() + 120  # a bound on never: the member records the cell once it has ended it
            while not ended(folder / "env.json") and time.monotonic() < deadline:
                time.sleep(0.2)
            env = read_json(folder / "env.json")
            assert (env["status"], env["error_kind"], env["error"]) == (
                "errored", contract.ERROR_INTERRUPTED, "interrupted by SIGTERM"), output
            with pytest.raises(ProcessLookupError):  # nothing of the cell outlives the run
                os.kill(child, 0)
    finally:
        for child in cells.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
