"""Nothing of a cell outlives it: `harness run` interrupted (SIGTERM, SIGINT) or timed out while ranks spin
in C code holding the GIL. Runs harness as users do, in a process of its own, on 2 CPU ranks."""

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
from process_helpers import is_alive

from harness.results import read_cell

pytest.importorskip("torch")
TORCH = __import__("importlib.metadata").metadata.version("torch").split("+")[0]
TRANSFORMERS = __import__("importlib.metadata").metadata.version("transformers").split("+")[0]
REPO = Path(__file__).resolve().parents[2]

SPINNING_SUITE = """
import os
import re
from pathlib import Path


def spin(pid_dir):
    import torch.distributed as dist

    Path(pid_dir, f"rank{dist.get_rank()}").write_text(f"{os.getpid()} {os.getppid()}")
    re.match(r"(a+)+$", "a" * 64 + "b")  # backtracking for ages inside C code, holding the GIL


def test_spins(ranks):
    Path(os.environ["CELL_PID_DIR"], "pytest").write_text(str(os.getpid()))
    ranks.run(2, spin, os.environ["CELL_PID_DIR"])
"""


def start_cell(tmp_path: Path, timeout_minutes: float) -> tuple[subprocess.Popen, Path, Path, Path]:
    """`harness run` on a one-cell matrix whose test spins on both ranks; (process, results, pids, tmpdir)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_spinning.py").write_text(SPINNING_SUITE)
    matrix = tmp_path / "spinning.yaml"
    matrix.write_text(textwrap.dedent(f"""
        axes: {{gpu: [cpu], gpus: [2], torch: ["{TORCH}"], transformers: ["{TRANSFORMERS}"]}}
        suite: ["{suite}"]
        timeout_minutes: {timeout_minutes}
        test_timeout_seconds: 300
    """))
    pids, temporary, results = tmp_path / "pids", tmp_path / "tmp", tmp_path / "results"
    pids.mkdir()
    temporary.mkdir()
    environ = {**os.environ, "CELL_PID_DIR": str(pids), "TMPDIR": str(temporary),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([sys.executable, "-m", "harness", "run", "--matrix", str(matrix), "--results",
                                str(results), "--env-dir", str(tmp_path / "envs")], env=environ, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return process, results, pids, temporary


def cell_pids(pids: Path) -> list[int]:
    """pytest, both ranks and the zygote that forked them."""
    return sorted({int(pid) for path in pids.iterdir() for pid in path.read_text().split()})


def wait_for_ranks(pids: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while not all((pids / name).exists() for name in ("pytest", "rank0", "rank1")):
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.2)
    time.sleep(0.5)  # into the spin


def env_json(results: Path) -> dict:
    [folder] = results.iterdir()
    return json.loads((folder / "env.json").read_text())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_cell_stops_every_process_and_leaves_an_errored_folder(tmp_path, signum):
    process, results, pids, temporary = start_cell(tmp_path, timeout_minutes=10)
    try:
        wait_for_ranks(pids, process)
        started = time.monotonic()
        os.kill(process.pid, signum)
        process.wait(timeout=60)
        stopped_s = time.monotonic() - started
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 128 + signum, process.stdout.read()
    assert [pid for pid in cell_pids(pids) if is_alive(pid)] == []  # gone before harness exited
    assert stopped_s < 30
    print(f"{signal.Signals(signum).name}: harness and every process of the cell gone in {stopped_s:.1f}s")
    env = env_json(results)
    assert env["status"] == "errored" and env["error"] == f"interrupted by {signal.Signals(signum).name}"
    assert env["end"] is not None
    [folder] = results.iterdir()
    assert (folder / "memory.json").is_file()
    assert list(temporary.iterdir()) == []  # no harness-cell-* or harness-pool-* folder survives


def test_a_cell_timeout_kills_ranks_spinning_in_c(tmp_path, monkeypatch):
    process, results, pids, temporary = start_cell(tmp_path, timeout_minutes=0.5)
    try:
        wait_for_ranks(pids, process)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 1
    assert [pid for pid in cell_pids(pids) if is_alive(pid)] == []
    assert env_json(results)["error"].startswith("timed out after 0.5 min")
    assert list(temporary.iterdir()) == []


def wait_until_gone(pids: list[int], deadline_s: float = 120) -> list[int]:
    """The pids still alive once they all ended or `deadline_s` passed (a bound on never, not a race)."""
    deadline = time.monotonic() + deadline_s
    while (alive := [pid for pid in pids if is_alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def test_a_harness_run_killed_by_sigkill_takes_pytest_and_its_ranks_with_it(tmp_path):
    """SIGKILL cannot be caught: pytest (in a session of its own) is tethered to the run by the parent-death
    signal, and its zygote and ranks die with it."""
    process, results, pids, _ = start_cell(tmp_path, timeout_minutes=10)
    try:
        wait_for_ranks(pids, process)
        os.kill(process.pid, signal.SIGKILL)  # the run alone, not its group: what it started must follow it
        process.wait(timeout=60)
        left = wait_until_gone(cell_pids(pids))
    finally:
        for pid in cell_pids(pids):  # whatever the outcome, nothing of this test outlives it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert left == [], f"alive after the run was SIGKILLed: {left}"
    [folder] = results.iterdir()
    assert read_cell(folder).status.value == "errored"  # the folder as the run began it: never read as passed
