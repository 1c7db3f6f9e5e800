"""The run loop against small throwaway suites (run_helpers.py): pass, fail, crash, hang, broken environment."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from run_helpers import TORCH, TRANSFORMERS, cell_folder, run, write_matrix

import harness.engines.local
import harness.run.command
import harness.run.plan
import harness.run.prepare
import harness.run.record
from harness import contract, errors
from harness.cli import main
from harness.plan.matrix import load_matrix


def read_env(folder: Path) -> dict:
    return json.loads((folder / "env.json").read_text())


def test_passing_cell_leaves_a_complete_folder(tmp_path):
    assert run(tmp_path, write_matrix(tmp_path, "passing")) == 0
    folder = cell_folder(tmp_path / "results")
    assert {p.name for p in folder.iterdir()} >= {"junit.xml", "env.json", "pytest.log", "memory.json"}
    env = read_env(folder)
    assert env["status"] == "passed" and env["exit_code"] == 0 and env["error"] is None
    assert env["cell"]["id"] == folder.name
    assert env["versions"]["torch"].startswith(TORCH) and env["versions"]["python"]
    assert env["start"] <= env["end"] and env["duration_s"] >= 0
    assert env["matrix_reference"] and env["pytest_args"] == []
    assert env["git_dirty"] in (True, False, None) and "git_sha" in env
    assert 'name="max_rel_grad_error"' in (folder / "junit.xml").read_text()
    log = (folder / "pytest.log").read_text()
    assert "2 passed" in log
    assert "PASSED" not in log  # a green suite's terminal counts its passed tests, it does not list each one
    memory = json.loads((folder / "memory.json").read_text())
    assert memory["available"] is False and memory["reason"]


def test_git_dirty_says_whether_tracked_files_differ_from_head(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_SHA", raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "tracked.txt").write_text("one")
    subprocess.run([*git, "add", "tracked.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    (repo / "untracked.txt").write_text("results and caches are not changes")
    assert harness.run.prepare.git_dirty(repo) is False
    (repo / "tracked.txt").write_text("two")
    assert harness.run.prepare.git_dirty(repo) is True
    assert harness.run.prepare.git_dirty(repo.parent) is None and harness.run.prepare.git_sha(repo.parent) is None


def test_git_sha_is_the_commit_checked_out_and_the_trigger_sha_is_recorded_apart(tmp_path, monkeypatch):
    """An issue_comment run's GITHUB_SHA is the default branch's head; the cell ran the pull request's."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "the pull request's head"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    monkeypatch.setenv("GITHUB_SHA", "0" * 40)  # the default branch's head
    assert harness.run.prepare.git_sha(repo) == head
    cell = load_matrix(write_matrix(tmp_path, "passing")).cells[0]
    host = harness.run.plan.Host(gpus=(), gpu_type=None, driver=None)
    record = harness.run.prepare.start_record(
        cell, host, [], 0.0, project=repo, matrix_reference="local", pytest_args=[]
    )
    assert (record.git_sha, record.trigger_sha, record.git_dirty) == (head, "0" * 40, False)


def test_failing_cell_is_failed_and_exits_1(tmp_path):
    assert run(tmp_path, write_matrix(tmp_path, "failing")) == 1
    env = read_env(cell_folder(tmp_path / "results"))
    assert env["status"] == "failed" and env["exit_code"] == 1


def test_a_one_rank_cell_that_ran_nothing_distributed_is_not_run_and_not_green(tmp_path, capsys):
    """HARNESS_CPU_RANKS=1 (a cpu cell of 1 rank): the ranks fixture skips both world sizes, the rest passes."""
    matrix = write_matrix(tmp_path, "distributed", ranks=1)
    assert run(tmp_path, matrix, "--", "--no-ranks-pool") == harness.run.command.EXIT_NOT_RUN
    folder = cell_folder(tmp_path / "results", ranks=1)
    env = read_env(folder)
    assert (env["status"], env["exit_code"], env["error"]) == ("not_run", 0, None)
    table = capsys.readouterr().out
    assert f"NOT RUN {folder.name}" in table and "harness: nothing distributed ran in the only cell" in table
    assert "nothing distributed ran: 2 cases need 2-4 ranks, this host has 1" in " ".join(table.split())
    comment = tmp_path / "comment.md"
    assert main(["report", str(tmp_path / "results"), "--format", "pr-comment", "-o", str(comment)]) == 0
    text = comment.read_text()
    assert "⏸️ **nothing distributed ran in the only cell**" in text and "passed**" not in text
    assert "nothing distributed ran: 2 cases need 2-4 ranks, this host has 1" in text


def test_the_terminal_ends_with_the_cells_table_and_the_verdict(tmp_path, capsys):
    """pytest's output scrolls up; what stays in view is harness's last lines: the reasons cases were not run
    come before the table, and under it the verdict, the cases by class, the cost, then where the results are."""
    matrix = write_matrix(tmp_path, "distributed", ranks=1)
    assert run(tmp_path, matrix, "--", "--no-ranks-pool") == harness.run.command.EXIT_NOT_RUN
    lines = capsys.readouterr().out.splitlines()
    folder = cell_folder(tmp_path / "results", ranks=1)
    header = next(index for index, line in enumerate(lines) if line.split()[:2] == ["pass", "fail"])
    assert lines.index("not run:") < lines.index("what the hosts could not run:") < header
    assert lines[header + 1:header + 4] == [f"NOT RUN {folder.name}", lines[header + 2], ""]
    verdict, *classes, cost, blank, results, render = lines[header + 4:]
    assert verdict.startswith("harness: nothing distributed ran in the only cell")
    assert re.fullmatch(r"\d+ cases: 0 new red · .* passed", " ".join(line.strip() for line in classes))
    assert cost.startswith("1 cell") and blank == ""
    assert results == f"results: {tmp_path / 'results'}"
    assert render.startswith("render:  ") and render.endswith(" -o harness-report.html")


@pytest.mark.parametrize(("statuses", "code"), [
    (["passed", "passed"], 0),
    (["passed", "not_run"], harness.run.command.EXIT_NOT_RUN),
    (["not_run", "not_run"], harness.run.command.EXIT_NOT_RUN),  # a matrix of cells that ran nothing is not green
    (["not_run", "failed"], 1),
    (["errored", "not_run"], 1),
])
def test_exit_status_is_1_for_red_and_its_own_code_for_not_run(statuses, code):
    assert harness.run.command.exit_status(statuses) == code


def test_run_help_ends_with_every_exit_status_the_code_gives(capsys):
    """The epilog is rendered from harness.errors, so it cannot drift from what harness run returns."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = capsys.readouterr().out
    listed = " ".join(help_text[help_text.index("\nexit status:\n"):].split())
    statuses = errors.run_exit_statuses()
    assert all(f"{status} {' '.join(meaning.split())}" in listed for status, meaning in statuses)
    codes = [status for status, _ in statuses]
    returned = {harness.run.command.exit_status(each) for each in (["passed"], ["failed"], ["passed", "not_run"])}
    assert {str(code) for code in returned} | {str(errors.ConfigError.return_code),
                                               str(errors.HostMismatchError.return_code)} <= set(codes)
    assert "bad input" in listed and "128+N stopped by signal N" in listed


JUNIT_CASE = ('<?xml version="1.0"?><testsuites><testsuite name="pytest"><testcase classname="t" name="test_{0}">'
              '<properties><property name="{1}" value="2"/></properties>{2}</testcase></testsuite></testsuites>')


@pytest.mark.parametrize(("prop", "result", "status"), [
    ("needs_world_size", '<skipped type="pytest.skip" message="needs 2 GPUs (1 visible)"/>', "not_run"),
    ("world_size", "", "passed"),
    # the words alone decide nothing: a skip without the property is an ordinary skip
    ("dtype", '<skipped type="pytest.skip" message="needs 2 GPUs (1 visible)"/>', "passed"),
])
def test_classify_reads_not_run_from_the_typed_properties(tmp_path, prop, result, status):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT_CASE.format("case", prop, result))
    cell = load_matrix(write_matrix(tmp_path, "passing")).cells[0]
    assert harness.run.record.classify(cell, 0, False, junit) == (status, None, None)
    assert harness.run.record.classify(cell, 1, False, junit)[0] == "failed"  # pytest's red stays red


def test_a_suite_that_raises_keyboardinterrupt_is_not_an_interrupted_cell(tmp_path):
    """pytest's own "interrupted" exit, chosen by the tested code, is no interruption harness saw: not the
    infrastructure kind `interrupted` (a SIGINT or SIGTERM to harness is, test_run_lifecycle.py)."""
    assert run(tmp_path, write_matrix(tmp_path, "self-interrupting")) == 1
    env = read_env(cell_folder(tmp_path / "results"))
    assert (env["status"], env["error_kind"], env["exit_code"]) == ("errored", "pytest", 2)
    assert env["error"] == "pytest exited 2 (interrupted); see pytest.log"


def test_a_run_with_pytest_args_records_them_and_its_reproduce_line_has_one_separator(tmp_path):
    """The run's own `-k` is kept and narrowed to the failing tests (issue 29: not `-- -k X -- -k test_broken`)."""
    from harness.results import load_results

    matrix = write_matrix(tmp_path, "failing")
    assert run(tmp_path, matrix, "--", "-k", "test_ok or test_broken", "-p", "no:cacheprovider") == 1
    folder = cell_folder(tmp_path / "results")
    env = read_env(folder)
    assert env["pytest_args"] == ["-k", "test_ok or test_broken", "-p", "no:cacheprovider"]
    assert env["matrix_reference"] == str(matrix) and "reproduce" not in env  # typed fields, no command line
    (cell,) = load_results([tmp_path / "results"]).cells
    assert cell.reproduce_command() == (
        f"harness run --matrix {matrix} --cell {folder.name} -- -k '(test_ok or test_broken) and (test_broken)' "
        "-p no:cacheprovider"
    )


def test_crashing_pytest_is_errored(tmp_path):
    assert run(tmp_path, write_matrix(tmp_path, "crashing")) == 1
    env = read_env(cell_folder(tmp_path / "results"))
    assert env["status"] == "errored"
    assert env["error"] == "pytest crashed: killed by signal SIGKILL"


def test_no_tests_is_errored_not_green(tmp_path):
    assert run(tmp_path, write_matrix(tmp_path, "empty")) == 1
    env = read_env(cell_folder(tmp_path / "results"))
    assert env["status"] == "errored" and "no tests collected" in env["error"]


def test_hang_past_the_cell_timeout_is_killed_with_its_children(tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("CHILD_PID_FILE", str(pid_file))
    monkeypatch.setattr("harness.engines.local.INTERRUPT_GRACE_SECONDS", 3)
    assert run(tmp_path, write_matrix(tmp_path, "hanging", timeout_minutes=0.1)) == 1
    env = read_env(cell_folder(tmp_path / "results"))
    assert env["status"] == "errored" and env["error"].startswith("timed out after 0.1 min")
    child = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


@pytest.mark.usefixtures("pip_index")  # it lists torch 0.0.1: the build itself must fail
def test_broken_environment_is_errored_with_the_installer_message(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_INSTALLER", "uv")
    monkeypatch.setenv("HARNESS_INSTALLER_ARGS", "--offline")
    assert run(tmp_path, write_matrix(tmp_path, "passing", torch="0.0.1")) == 1
    folder = cell_folder(tmp_path / "results", torch="0.0.1")
    env = read_env(folder)
    assert env["status"] == "errored" and env["exit_code"] is None
    assert env["error"].startswith("environment: uv exited") and "torch" in env["error"]
    assert (folder / "memory.json").is_file() and (folder / "install.log").is_file()


@pytest.mark.usefixtures("pip_index")  # it lists torch 0.0.1: the build itself must fail
def test_one_broken_cell_does_not_stop_the_next(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_INSTALLER", "uv")
    monkeypatch.setenv("HARNESS_INSTALLER_ARGS", "--offline")
    suite_dir = tmp_path / "suite_passing"
    write_matrix(tmp_path, "passing")
    matrix = tmp_path / "two.yaml"
    matrix.write_text(textwrap.dedent(f"""
        axes: {{gpu: [cpu], gpus: [2], torch: ["0.0.1", "{TORCH}"], transformers: ["{TRANSFORMERS}"]}}
        suite: ["{suite_dir}"]
    """))
    assert run(tmp_path, str(matrix)) == 1
    assert read_env(cell_folder(tmp_path / "results", torch="0.0.1"))["status"] == "errored"
    assert read_env(cell_folder(tmp_path / "results"))["status"] == "passed"


def test_stale_files_of_an_earlier_run_are_cleared(tmp_path):
    folder = cell_folder(tmp_path / "results")
    folder.mkdir(parents=True)
    (folder / "junit.xml").write_text("stale")
    (folder / "leftover.txt").write_text("stale")
    assert run(tmp_path, write_matrix(tmp_path, "crashing")) == 1
    assert not (folder / "leftover.txt").exists()
    assert not (folder / "junit.xml").exists()  # the killed pytest wrote none; the stale one is gone


def test_gpu_cell_on_a_cpu_machine_is_refused_with_exit_3(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("harness.run.plan.detect_host",
                        lambda: harness.run.plan.Host(gpus=(), gpu_type=None, driver=None))
    assert run(tmp_path, "h200-2gpu") == 3
    err = capsys.readouterr().err
    assert "cannot host 2 of 2 cells" in err and "needs 2 h200 GPUs, this machine has none" in err
    assert not (tmp_path / "results").exists()


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path, capsys):
    assert run(tmp_path, write_matrix(tmp_path, "passing"), "--dry-run") == 0
    out = capsys.readouterr().out
    assert "environment: this interpreter" in out and "--junitxml=" in out
    assert not (tmp_path / "results").exists()


def test_pytest_args_after_double_dash_reach_pytest(tmp_path):
    assert run(tmp_path, write_matrix(tmp_path, "failing"), "--", "-k", "test_ok") == 0
    assert "1 passed, 1 deselected" in (cell_folder(tmp_path / "results") / "pytest.log").read_text()


def test_a_passing_tests_rank_output_is_in_junit_not_in_the_log(tmp_path):
    """What a rank writes is its test's: in the testcase's system-out, not in pytest.log (the terminal)."""
    assert run(tmp_path, write_matrix(tmp_path, "chatty")) == 0
    folder = cell_folder(tmp_path / "results")
    assert "a rank says hello" not in (folder / "pytest.log").read_text()
    junit = (folder / "junit.xml").read_text()
    assert "--- rank 0 stdout ---\na rank says hello" in junit and "--- rank 1 stdout ---" in junit
    assert (folder / "ranks.log").is_file()


def test_output_streams_in_chunks_before_the_line_ends(tmp_path):
    """pytest's progress dots for one file are one line: they must reach the terminal and pytest.log as they
    come, not when the line (or the cell) ends."""
    import threading

    read_end, write_end = os.pipe()
    arrived = threading.Event()
    echoed: list[bytes] = []

    def echo(chunk: bytes) -> None:
        echoed.append(chunk)
        arrived.set()

    log_path = tmp_path / "pytest.log"
    with open(read_end, "rb") as source, log_path.open("wb") as log_file:
        reader = threading.Thread(target=harness.engines.local.stream_output, args=(source, log_file, echo))
        reader.start()
        os.write(write_end, b"tests/gpu/test_x.py ..")
        assert arrived.wait(30), "a chunk without a newline did not come through while the writer was alive"
        assert log_path.read_bytes() == b"tests/gpu/test_x.py .."
        os.write(write_end, b"F\n")
        os.close(write_end)
        reader.join(30)
    assert b"".join(echoed) == log_path.read_bytes() == b"tests/gpu/test_x.py ..F\n"


def test_a_closed_terminal_does_not_stop_the_log(tmp_path):
    def gone(chunk: bytes) -> None:
        raise BrokenPipeError

    read_end, write_end = os.pipe()
    os.write(write_end, b"one\n")
    os.close(write_end)
    with open(read_end, "rb") as source, (tmp_path / "pytest.log").open("wb") as log_file:
        harness.engines.local.stream_output(source, log_file, gone)
    assert (tmp_path / "pytest.log").read_bytes() == b"one\n"


def test_the_execute_stage_runs_the_cells_engine_and_an_interrupted_job_is_recorded(tmp_path, monkeypatch):
    """The cell's engine is looked up by its `engine:`; what the engine learned of its job before harness was
    interrupted (its id, its hosts) is in env.json, and the interruption goes on once the folder is written."""
    import sys

    from harness.engines import EngineCause, Interrupted, Ran
    from harness.envs.build import Environment

    launches = []

    class Standin:
        name, runs_here = "slurm", False

        def run(self, launch, job):
            launches.append(launch)
            job["job_id"], job["hosts"] = "42", ["h0", "h1"]
            if launch.pytest_args:
                raise Interrupted(15)
            return Ran(exit_code=0, cause=EngineCause(contract.ERROR_HOST_LOST, "host 1 (h1) lost: silent"))

    monkeypatch.setitem(harness.engines.REGISTRY, "slurm", Standin())
    cell = dataclasses.replace(load_matrix(write_matrix(tmp_path, "passing")).cells[0], engine="slurm", hosts=2)
    here = Environment(python=Path(sys.executable), origin="current", path=None, versions={"python": "3"})
    common = dict(host=harness.run.plan.Host(gpus=(), gpu_type=None, driver=None), env_dir=tmp_path / "envs",
                  log=lambda line: None, project=tmp_path, matrix_reference="m",
                  prepare_environment=lambda cell, env_dir, log: here)
    outcome = harness.run.command.run_cell(cell, results_root=tmp_path / "a", pytest_args=[], **common)
    env = read_env(outcome.folder)
    # The engine's kind, as it typed it: what triage reads (the words are for people).
    assert (env["status"], env["error_kind"], env["error"]) == ("errored", "host_lost", "host 1 (h1) lost: silent")
    assert (env["job_id"], env["hosts"], env["exit_code"], env["versions"]["python"]) == ("42", ["h0", "h1"], 0, "3")
    with pytest.raises(Interrupted):
        harness.run.command.run_cell(cell, results_root=tmp_path / "b", pytest_args=["-x"], **common)
    env = read_env(tmp_path / "b" / cell.id)
    assert env["error"] == "cancelled: harness interrupted by SIGTERM; slurm job 42 cancelled"
    assert (env["error_kind"], env["hosts"], env["exit_code"]) == ("interrupted", ["h0", "h1"], None)
    assert [launch.gpus for launch in launches] == [(), ()]
    assert (outcome.folder / "memory.json").is_file()
