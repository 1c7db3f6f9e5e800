"""harness in another repository: its own matrices beside the shipped ones, paths from the project root,
and one clear line for every bad input."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.plan.matrix import load_matrix
from harness.plan.runners import load_runners
from harness.project import shipped_matrices_dir

TORCH = importlib.metadata.version("torch").split("+")[0]
TRANSFORMERS = importlib.metadata.version("transformers").split("+")[0]


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], check=True)
    return path


def head(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def adopter(tmp_path, monkeypatch):
    """A repository with its own runners, its own matrix, an override of a shipped one and a passing test."""
    monkeypatch.delenv("GITHUB_SHA", raising=False)
    monkeypatch.delenv("HARNESS_MATRICES_DIR", raising=False)
    repo = git_repo(tmp_path / "adopter")
    (repo / "matrices").mkdir()
    (repo / "matrices" / "runners.yaml").write_text("l4: {labels: [self-hosted, gpu-l4], gpus: 4}\n")
    (repo / "matrices" / "mine.yaml").write_text(
        textwrap.dedent(f"""
        description: the adopter's own
        axes: {{gpu: [cpu], gpus: [2], torch: ["{TORCH}"], transformers: ["{TRANSFORMERS}"]}}
        suite: [tests]
        timeout_minutes: 5
    """)
    )
    (repo / "matrices" / "pr.yaml").write_text(
        textwrap.dedent("""
        description: the adopter's pr matrix, on its own runner
        axes: {gpu: [l4], gpus: [4], torch: ["2.11.0"], transformers: ["5.24.0"]}
    """)
    )
    (repo / "tests").mkdir()
    (repo / "tests" / "test_it.py").write_text("def test_it():\n    assert True\n")
    (repo / "deep" / "sub").mkdir(parents=True)
    return repo


def test_the_shipped_matrices_are_package_data():
    assert {"cpu.yaml", "runners.yaml", "nightly.yaml"} <= {p.name for p in shipped_matrices_dir().iterdir()}


def test_a_repositorys_matrices_add_to_and_override_the_shipped_ones(adopter, monkeypatch, capsys):
    monkeypatch.chdir(adopter / "deep" / "sub")
    assert main(["matrix", "--list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "repository" in lines["mine"] and "overrides" not in lines["mine"]
    assert "repository" in lines["pr"] and f"overrides {shipped_matrices_dir() / 'pr.yaml'}" in lines["pr"]
    assert "shipped" in lines["nightly"]
    assert [cell.id for cell in load_matrix("pr").cells] == ["l4-4gpu-torch2.11.0-tf5.24.0"]
    assert {"l4", "ada", "cpu"} <= set(load_runners())


def test_a_matrix_path_reads_runners_of_its_own_repository(adopter, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the adopter's repository
    matrix = load_matrix(str(adopter / "matrices" / "pr.yaml"))
    assert matrix.root == adopter.resolve() and matrix.reference == "matrices/pr.yaml"
    assert matrix.cells[0].labels == ("self-hosted", "gpu-l4")


def test_from_a_subfolder_every_file_of_a_cell_lands_in_the_project_root(adopter, monkeypatch, capsys):
    monkeypatch.chdir(adopter / "deep" / "sub")
    assert main(["run", "--matrix", "mine", "--env-dir", str(adopter.parent / "envs")]) == 0
    folder = adopter / "results" / f"cpu-2rank-torch{TORCH}-tf{TRANSFORMERS}"
    assert {"junit.xml", "env.json", "pytest.log", "memory.json"} <= {p.name for p in folder.iterdir()}
    env = json.loads((folder / "env.json").read_text())
    assert env["status"] == "passed" and env["git_sha"] == head(adopter)
    assert env["matrix_reference"] == "mine" and env["cell"]["id"] == folder.name
    out = capsys.readouterr().out
    assert f"results in {folder}" in out
    assert out.rstrip().endswith(f"render:  harness report {adopter / 'results'} -o harness-report.html")


SAMPLE_CELL = Path(__file__).parent / "golden" / "samples" / "notrun" / "ada-1gpu-torch2.11.0-tf5.24.0"


def test_report_reads_the_projects_results_by_default_and_a_relative_path_from_the_root(tmp_path, monkeypatch,
                                                                                       capsys):
    """`harness report` with no RESULTS reads what `harness run` wrote (the project's results/), and a relative
    RESULTS from a subfolder is the folder `harness run --results` of the same words writes: both from the root."""
    import shutil

    import harness.report.render
    import harness.run.plan

    repo = git_repo(tmp_path / "repo")
    shutil.copytree(SAMPLE_CELL, repo / "results" / SAMPLE_CELL.name)
    shutil.copytree(SAMPLE_CELL, repo / "elsewhere" / SAMPLE_CELL.name)
    (repo / "deep" / "sub").mkdir(parents=True)
    monkeypatch.chdir(repo / "deep" / "sub")
    for arguments in ([], ["results"], ["elsewhere"]):
        assert main(["report", *arguments]) == 0, arguments
        assert f"NOT RUN {SAMPLE_CELL.name}" in capsys.readouterr().out
    root = repo.resolve()
    for value in ("results", "elsewhere", "new/folder"):  # one function: the same folder for both commands
        assert harness.run.plan.results_folder(value, root) == root / value
    (root / "new" / "folder").mkdir(parents=True)
    assert harness.report.render.results_folders(["new/folder"]) == [root / "new" / "folder"]
    # A name completed from the working directory (a folder there) is that folder.
    monkeypatch.chdir(repo / "results")
    assert main(["report", SAMPLE_CELL.name]) == 0
    assert f"NOT RUN {SAMPLE_CELL.name}" in capsys.readouterr().out


def test_report_says_where_it_looked_for_a_relative_results_folder(tmp_path, monkeypatch, capsys):
    repo = git_repo(tmp_path / "repo")
    (repo / "sub").mkdir()
    monkeypatch.chdir(repo / "sub")
    assert main(["report"]) == 2
    root = repo.resolve()
    assert capsys.readouterr().err == (
        f"harness: error: results path results is not a folder: looked for {root / 'results'}, resolving against "
        f"the project root {root} (the git top level of the working directory), as harness run --results does\n")


def test_install_entries_resolve_from_the_project_root_and_key_the_environment(adopter, monkeypatch):
    from harness.cell.preflight import environment_spec
    from harness.envs import build as env

    monkeypatch.chdir(adopter / "deep")
    matrix = adopter / "matrices" / "mine.yaml"
    matrix.write_text(matrix.read_text() + 'install: ["-e .", "six==1.16.0"]\n')
    (cell,) = load_matrix("matrices/mine.yaml").cells
    assert cell.install == (f"-e {adopter.resolve()}", "six==1.16.0")
    spec = environment_spec(cell)
    assert env.requirements(spec)[-3:] == ["-e", str(adopter.resolve()), "six==1.16.0"]
    plain = dataclasses.replace(spec, install=())
    assert env.env_key(spec) != env.env_key(plain) and env.env_key(spec).startswith(env.env_key(plain))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--matrix", "cpu", "--results", "{file}", "--dry-run"], "is a file; give a folder"),
        (["matrix", "--matrix", "{folder}/missing.yaml"], "no such matrix file"),
        (["matrix", "--matrix", "{folder}"], "is a folder; --matrix takes a matrix name or a YAML file"),
        (["matrix", "--matrix", "nope"], "unknown matrix 'nope'"),
        (["matrix"], "give --matrix NAME_OR_PATH, or --list"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "a-file").write_text("")
    argv = [arg.format(file=tmp_path / "a-file", folder=tmp_path) for arg in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err and err.startswith("harness: error: ")


def test_debug_works_after_the_subcommand(capsys):
    assert main(["matrix", "--matrix", "nope", "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_a_closed_pipe_ends_quietly(local_index):
    local_index({"torch": ["2.11.0", "2.13.0"], "transformers": ["5.0.0", "5.17.0", "5.20.0", "5.24.0", "5.25.0"]})
    reader = subprocess.Popen(
        [sys.executable, "-m", "harness", "matrix", "--matrix", "nightly", "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    reader.stdout.read(10)
    reader.stdout.close()
    assert reader.wait(timeout=60) in (0, 141)
    assert reader.stderr.read() == b""


def test_dry_run_shows_the_plan_with_refused_cells_summarized(capsys, monkeypatch):
    from harness.run import plan as run

    monkeypatch.setattr(run, "detect_host", lambda: run.Host(gpus=(), gpu_type=None, driver=None))
    assert main(["run", "--matrix", "nightly", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sum("would be refused: needs" in line for line in out) > 10
    (summary,) = [line for line in out if line.startswith("this machine cannot host")]
    assert len(summary) < 400 and "would stop with exit 3" in summary and "cells: nightly" not in summary


def test_a_built_environment_imports_this_harness_and_nothing_else_of_its_venv(tmp_path):
    from harness.run import prepare as run

    with run.harness_import_path() as folder:
        entries = {path.name for path in folder.iterdir()}
        assert "harness" in entries and all(name == "harness" or name.endswith(".dist-info") for name in entries)
        probe = subprocess.run(
            [sys.executable, "-S", "-c", "import harness, sys; print(harness.__file__)"],
            env={"PYTHONPATH": str(folder), "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
        )
        assert probe.returncode == 0 and probe.stdout.strip().endswith("harness/__init__.py"), probe.stderr
        # pytest finds harness's entry points (the ranks plugin's pytest11, once declared) through it too
        found = subprocess.run(
            [sys.executable, "-S", "-c", "import importlib.metadata as m; print(m.distribution('harness').version)"],
            env={"PYTHONPATH": str(folder), "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
        )
        assert found.stdout.strip() == importlib.metadata.version("harness"), found.stderr
    assert not folder.exists()


def test_an_interpreter_holds_installs_by_name_and_version(tmp_path):
    from harness.envs import build as env

    def spec(*install: str) -> env.EnvSpec:
        return env.EnvSpec(torch=TORCH, transformers=TRANSFORMERS, install=install)

    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "pytest"\n')  # a name this interpreter has
    assert env.holds_installs(sys.executable, spec())
    assert env.holds_installs(sys.executable, spec("pytest>=1", f"-e {project}"))
    assert not env.holds_installs(sys.executable, spec("pytest==0.0.1"))
    assert not env.holds_installs(sys.executable, spec("no-such-package-here"))
    assert not env.holds_installs(sys.executable, spec("--index-url http://x pkg"))


def test_a_checkout_on_pythonpath_finds_its_matrices_and_reports(tmp_path):
    """Not installed (a checkout on PYTHONPATH, as on a bare GPU machine), the package data folders do not
    exist as packages: the checkout's own matrices/ and reports/ are used."""
    checkout = Path(__file__).resolve().parents[2]
    code = (
        "from harness.project import shipped_matrices_dir, shipped_reports_dir; "
        "print(shipped_matrices_dir()); print(shipped_reports_dir())"
    )
    # -S: no site-packages, so the installed harness (and its package-dir mapping) is out of sight.
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(checkout)}, check=True)
    assert done.stdout.split() == [str(checkout / "matrices"), str(checkout / "reports")]


def test_the_project_root_says_how_it_was_found(tmp_path, monkeypatch):
    from harness.project import find_project_root

    repository = git_repo(tmp_path / "repository").resolve()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    matrix = repository / "m.yaml"
    found = find_project_root(matrix)
    assert (found.path, found.found_as, found.in_git) == (repository, f"the git top level of {matrix}", True)
    found = find_project_root()
    assert (found.path, found.found_as, found.in_git) == (
        elsewhere.resolve(), "the working directory: no git repository holds it", False)
    monkeypatch.chdir(repository)
    found = find_project_root(elsewhere / "m.yaml")  # a matrix file outside git: the working directory's repository
    assert (found.path, found.found_as) == (repository, "the git top level of the working directory")
