"""The code under test signalling its own `harness run` (SIGTERM or SIGINT) does not turn its red into an
interruption: harness asks the kernel who sent each signal (harness.engines.interruption, senders). A signal from
a process of the cell stops nothing and makes the cell errored `signalled_harness`, a red triage bisects; one from
outside (here: this test, the run's parent) still interrupts, as the runner's cancel does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import contract
from harness.results import read_cell
from harness.results.triage import Triage, classify_cell

pytest.importorskip("torch")
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs /proc")

# The cell's one test. It finds the `harness run` above it (its parent, or further up) by its command line.
HOSTILE_SUITE = r'''
import os
import signal
import subprocess
import time
from pathlib import Path

MARK = Path(os.environ["SIGNAL_TEST_MARK"])


def harness_run_pid() -> int:
    pid = os.getpid()
    while pid > 1:
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"harness" in words and b"run" in words:  # python -m harness run ...
            return pid
    raise AssertionError("no harness run above this test")


def test_signals_its_harness_then_fails():
    mode = os.environ["SIGNAL_TEST_MODE"]
    harness = harness_run_pid()
    if mode == "self":  # this test's own process sends it, and lives on
        os.kill(harness, signal.SIGTERM)
    elif mode == "kill-command":  # a short-lived sender: gone (reaped) moments after the signal
        subprocess.run(["kill", "-TERM", str(harness)], check=True)
    MARK.write_text(str(harness))
    if mode == "wait":  # for a signal from outside: ended by harness long before this deadline
        time.sleep(600)
    assert mode == "never", "the code under test's own failure"
'''


def run_cell(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path, Path]:
    """`harness run` of a one-cell matrix whose test signals (or waits); (process, results, mark)."""
    from run_helpers import write_suite_matrix  # after the module's torch check: run_helpers reads torch's version

    matrix = write_suite_matrix(tmp_path / "suite", "test_hostile_signal.py", HOSTILE_SUITE,
                                tmp_path / "signal.yaml", timeout_minutes=10, test_timeout_seconds=600)
    results, mark = tmp_path / "results", tmp_path / "signalled"
    environ = {**os.environ, "SIGNAL_TEST_MODE": mode, "SIGNAL_TEST_MARK": str(mark),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([sys.executable, "-m", "harness", "run", "--matrix", str(matrix), "--results",
                                str(results), "--env-dir", str(tmp_path / "envs")], env=environ, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return process, results, mark


def finish(process: subprocess.Popen, timeout_s: float = 600) -> str:
    try:
        return process.communicate(timeout=timeout_s)[0]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def env_json(results: Path) -> dict:
    [folder] = results.iterdir()
    return json.loads((folder / contract.ENV_JSON).read_text())


def test_a_sigterm_from_the_tested_code_is_its_red_not_an_interruption(tmp_path):
    process, results, mark = run_cell(tmp_path, "self")
    output = finish(process)
    env = env_json(results)
    assert env["error_kind"] != contract.ERROR_INTERRUPTED, output
    assert mark.read_text() == str(process.pid), output  # the test found the run and signalled it
    assert (env["status"], env["error_kind"]) == ("errored", contract.ERROR_SIGNALLED_HARNESS), output
    assert env["error"].startswith("the tested code sent harness SIGTERM: pid "), env["error"]
    assert "a process of the cell" in env["error"]
    assert process.returncode == 1, output  # the run went on: not 128+15
    [folder] = results.iterdir()
    cell = read_cell(folder)
    [test] = cell.tests  # the cell ran on: its test failed on its own
    assert test.outcome.value == "failed" and "the code under test's own failure" in (test.message or "")
    assert classify_cell(cell).triage is Triage.REAL  # bisected, not infrastructure


def test_a_sigterm_from_a_sender_that_exits_at_once_is_still_the_cells(tmp_path):
    """`kill` exits right after its signal and its parent (the test) reaps it: harness may find it still there (a
    process of the cell: the cell runs on) or gone (unattributable: harness stops, as for a person's `pkill`). Either
    way the cell is the tested code's red."""
    process, results, _ = run_cell(tmp_path, "kill-command")
    output = finish(process)
    env = env_json(results)
    assert env["error_kind"] != contract.ERROR_INTERRUPTED, output
    assert (env["status"], env["error_kind"]) == ("errored", contract.ERROR_SIGNALLED_HARNESS), output
    assert process.returncode in (1, 128 + signal.SIGTERM), output


def test_a_sigterm_from_outside_the_cell_still_interrupts(tmp_path):
    process, results, mark = run_cell(tmp_path, "wait")
    try:
        deadline = time.monotonic() + 300
        while not mark.exists():
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "the cell's test never started"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)  # from this test: the run's parent, outside its cell
    finally:
        output = finish(process)
    assert process.returncode == 128 + signal.SIGTERM, output
    env = env_json(results)
    assert (env["status"], env["error_kind"], env["error"]) == (
        "errored", contract.ERROR_INTERRUPTED, "interrupted by SIGTERM"), output


def test_whose_a_sender_is():
    from harness.engines import senders
    from harness.engines.senders import Whose

    me, parent = os.getpid(), os.getppid()
    assert senders.identify(0, me=me, parent=parent).whose is Whose.OUTSIDE  # the kernel: a terminal's Ctrl-C
    assert senders.identify(me, me=me, parent=parent).whose is Whose.OUTSIDE  # harness itself
    assert senders.identify(parent, me=me, parent=parent).whose is Whose.OUTSIDE
    # A grandchild that left its parent's session: still below harness.
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '600'], "
                              "start_new_session=True)"])
    try:
        deadline = time.monotonic() + 60
        while not (grandchildren := _children(child.pid)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        grandchild = senders.identify(grandchildren[0], me=me, parent=parent)
        assert grandchild.whose is Whose.CELL and grandchild.command == "sleep 600"
        assert senders.identify(child.pid, me=me, parent=parent).whose is Whose.CELL
        assert senders.identify(me, me=child.pid, parent=parent).whose is Whose.OUTSIDE  # above, not below
    finally:
        child.kill()
        child.wait()
        for pid in grandchildren:
            os.kill(pid, signal.SIGKILL)
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: nothing of it is left to read
    assert senders.identify(gone.pid, me=me, parent=parent).whose is Whose.UNKNOWN
    assert senders.identify(gone.pid, me=me, parent=gone.pid).whose is Whose.OUTSIDE  # the run's parent, dying


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found
