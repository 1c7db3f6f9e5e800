"""`harness run` before any cell: the project root and its suites, a results folder that takes files and
holds one run only (an earlier run kept aside: test_keep_results.py). Each mistake is one line and exit 2, before
anything is built or run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from run_helpers import cell_folder, run, write_matrix

from harness.cli import main
from harness.errors import ConfigError


def unwritable_folder(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    return Path("/sys/kernel")  # root may write wherever a mode allows; sysfs takes no new files


def test_a_results_folder_that_takes_no_files_is_one_line_and_exit_2(tmp_path, capsys):
    folder = unwritable_folder(tmp_path)
    assert main(["run", "--matrix", write_matrix(tmp_path, "passing"), "--results", str(folder),
                 "--env-dir", str(tmp_path / "envs")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"harness: error: --results {folder}: cannot write to {folder}: ")
    assert error.count("\n") == 1 and "Traceback" not in error


def test_outside_a_git_repository_a_missing_suite_says_where_it_looked(tmp_path, capsys, monkeypatch):
    project = tmp_path / "not-a-repository"
    project.mkdir()
    monkeypatch.chdir(project)
    matrix = project / "m.yaml"
    matrix.write_text('axes: {gpu: [cpu], gpus: [2], torch: ["2.13.0"], transformers: ["5.24.0"]}\n'
                      "suite: [tests/gpu, tests/more.py::test_one]\n")
    assert main(["run", "--matrix", str(matrix), "--dry-run"]) == 2
    error = capsys.readouterr().err.splitlines()
    root = project.resolve()
    assert error == [
        f"harness: warning: {root} is not in a git repository: it is taken as the project root and env.json "
        "records no commit",
        f"harness: error: suite tests/gpu, tests/more.py::test_one of {matrix.resolve()} not found: looked for "
        f"{root}/tests/gpu and {root}/tests/more.py, resolving against the project root {root} (the working "
        "directory: no git repository holds it)",
    ]


def test_the_embedded_defaults_missing_suite_names_what_was_searched_not_a_shipped_file(tmp_path, capsys,
                                                                                         monkeypatch):
    """Issue 29: `harness run` in a folder outside git blamed the shipped matrix file for the missing suite."""
    import harness.run.plan

    monkeypatch.chdir(tmp_path)
    no_gpus = harness.run.plan.Host(gpus=(), gpu_type=None, driver=None)
    monkeypatch.setattr(harness.run.plan, "detect_host", lambda: no_gpus)
    monkeypatch.delenv("HARNESS_MATRICES_DIR", raising=False)
    assert main(["run", "--dry-run"]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    root = tmp_path.resolve()
    assert error.startswith("harness: error: suite tests/gpu of the embedded default (no --matrix: ")
    assert error.endswith(f" not found: looked for {root}/tests/gpu, resolving against the project root {root} "
                          "(the working directory: no git repository holds it)")


def test_the_embedded_gpu_cell_is_said_to_come_from_the_default_not_from_runners_yaml(tmp_path):
    from harness.cell.preflight import check_project
    from harness.plan.cells import Matrix
    from harness.project import ProjectRoot
    from harness.run.plan import suite_origin

    project = ProjectRoot(path=tmp_path, found_as="the git top level of the working directory", in_git=True)
    local = Matrix(name="local", path=Path("/site-packages/harness/_matrices/runners.yaml"), description="",
                   cells=(), project=project, reference="local")
    with pytest.raises(ConfigError) as error:
        check_project(project, [(suite_origin(local, named=False), ("tests/gpu",))])
    assert str(error.value) == (
        f"suite tests/gpu of the embedded default (no --matrix) not found: looked for {tmp_path}/tests/gpu, "
        f"resolving against the project root {tmp_path} (the git top level of the working directory)"
    )


def test_cells_of_an_earlier_run_are_kept_aside_and_said_other_folders_stay(tmp_path, capsys):
    results = tmp_path / "results"
    earlier = results / "cpu-4rank-torch2.0.0-tf5.0.0"
    earlier.mkdir(parents=True)
    (earlier / "env.json").write_text('{"status": "errored"}')
    (results / "bisect" / "transformers5.20.0").mkdir(parents=True)  # not a cell folder: stays
    assert run(tmp_path, write_matrix(tmp_path, "passing")) == 0
    assert sorted(path.name for path in results.iterdir()) == [".earlier", "bisect", cell_folder(results).name]
    [kept] = (results / ".earlier").iterdir()  # env.json names no start: the folder's time names the run
    assert (kept / earlier.name / "env.json").read_text() == '{"status": "errored"}'
    out = capsys.readouterr().out
    assert f"kept 1 folder of an earlier run aside in {kept}/: {earlier.name} (a results folder holds one run; " \
        f"rm -r {results / '.earlier'} removes every kept run)" in out


@pytest.mark.parametrize(("first", "said"), [((), True), (("--", "-k", "test_two"), False)])
def test_a_selection_replacing_a_full_run_says_so(tmp_path, capsys, first, said):
    matrix = write_matrix(tmp_path, "passing")
    assert run(tmp_path, matrix, *first) == 0
    capsys.readouterr()
    assert run(tmp_path, matrix, "--", "-k", "test_one") == 0
    folder = cell_folder(tmp_path / "results")
    message = f"{folder.name}: this run of pytest -k test_one takes the place of its full results, kept in "
    assert (message in capsys.readouterr().out) is said


@pytest.mark.parametrize(("record", "full"), [
    ({"pytest_args": [], "reproduce": "harness run --cell c"}, True),
    ({"pytest_args": ["-k", "ep"], "reproduce": "harness run --cell c"}, False),
    ({"pytest_args": "-k ep", "reproduce": "harness run --cell c"}, False),  # not what harness writes
    ({"reproduce": "harness run --cell c"}, True),  # written before pytest_args: the recorded command says
    ({"reproduce": "harness run --cell c -- -k ep"}, False),
])
def test_a_full_run_is_one_without_pytest_arguments(tmp_path, record, full):
    from harness.cell.preflight import earlier_was_full_run

    (tmp_path / "env.json").write_text(json.dumps(record))
    assert earlier_was_full_run(tmp_path) is full


def test_the_render_hint_names_the_harness_that_ran(tmp_path, monkeypatch):
    from harness.run.render import this_command

    script = tmp_path / ".venv" / "bin" / "harness"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr("sys.argv", [".venv/bin/harness", "run"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the venv is not on PATH: `harness` would not be found
    assert this_command() == ".venv/bin/harness"
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    assert this_command() == "harness"


@pytest.mark.parametrize(("nvml_name", "gpu_type"), [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                                      ("NVIDIA RTX 6000 Ada Generation", "ada")])
def test_this_machines_gpu_type_is_told_by_the_name_nvml_reports(nvml_name, gpu_type, monkeypatch):
    """`harness run` with no --matrix builds its cell from the type runners.yaml's nvml_name gives this machine's
    GPUs; an H100 machine was refused ("no GPU type has nvml_name matching 'NVIDIA H100 80GB HBM3'")."""
    import sys

    from fake_nvml import FakeGpu, FakeNvml

    import harness.run.plan

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # this checkout's matrices/runners.yaml
    monkeypatch.delenv("HARNESS_MATRICES_DIR", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(uuid=f"GPU-0000000{k}-preflight", name=nvml_name)
                                                         for k in range(2)]))
    host = harness.run.plan.detect_host()
    assert host.gpu_type == gpu_type and [gpu.name for gpu in host.gpus] == [nvml_name] * 2
