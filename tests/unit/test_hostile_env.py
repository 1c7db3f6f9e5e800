"""The environment trust model against the attacks of a pull request's code (same user as the runner):
planting code in a cached environment and re-recording its manifest, editing an installed file that uv
hard-linked from its cache, and planting code in a `bisect --repo` commit environment."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from env_helpers import CELL
from tamper import plant_pth

from harness.bisect import commits
from harness.cli import main
from harness.envs import build as env

AXES = "axes: {gpu: [GPU], gpus: [1], torch: ['2.11.0'], transformers: ['5.9.0']}\n"


# ---------------------------------------------------------------- 1. a planted .pth with its manifest re-recorded


def test_a_replanted_manifest_hides_the_pth_from_the_check_so_the_check_is_not_the_boundary(tmp_path, monkeypatch):
    """The attack: the run's code is the cache's user, so it re-records the manifest after planting. No
    check inside that user can tell; this is why a pull request's cell is refused on a persistent runner."""
    path = tmp_path / "env"
    (path / "bin").mkdir(parents=True)
    env.write_manifest(path)
    plant_pth(path)
    env.write_manifest(path)  # what the planted code does next
    assert env.manifest_difference(path) is None


@pytest.mark.parametrize("gpu", ["ada", "h200", "gb200"])
def test_a_pull_requests_cell_on_a_persistent_runner_is_refused_at_plan_time(tmp_path, capsys, gpu):
    (tmp_path / "m.yaml").write_text(AXES.replace("GPU", gpu))
    assert main(["matrix", "--matrix", str(tmp_path / "m.yaml"), "--pull-request", "--format", "github"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert f"m.yaml: gpu {gpu!r}: runners.yaml does not declare its runners ephemeral: true" in captured.err
    # the same plan for a trusted run (nightly) is fine
    assert main(["matrix", "--matrix", str(tmp_path / "m.yaml"), "--format", "ids"]) == 0


def test_a_runner_declared_ephemeral_takes_a_pull_requests_cell(tmp_path, capsys):
    (tmp_path / "runners.yaml").write_text("ada: {labels: [self-hosted, gpu-ada], gpus: 2, ephemeral: true}\n")
    (tmp_path / "m.yaml").write_text(AXES.replace("GPU", "ada"))
    assert main(["matrix", "--matrix", str(tmp_path / "m.yaml"), "--pull-request"]) == 0
    assert capsys.readouterr().out.split() == ["ada-1gpu-torch2.11.0-tf5.9.0"]


def test_the_shipped_cpu_runner_is_ephemeral_and_takes_a_pull_requests_cell(capsys):
    assert main(["matrix", "--matrix", "cpu", "--pull-request"]) == 0


def test_ephemeral_must_be_a_boolean(tmp_path, capsys):
    (tmp_path / "runners.yaml").write_text("ada: {labels: [gpu-ada], gpus: 2, ephemeral: 'yes'}\n")
    (tmp_path / "m.yaml").write_text(AXES.replace("GPU", "ada"))
    assert main(["matrix", "--matrix", str(tmp_path / "m.yaml")]) == 2
    assert "runners.yaml: ada.ephemeral: expected true or false, got 'yes'" in capsys.readouterr().err


def test_gpu_tests_plans_a_pull_requests_cells_with_pull_request():
    import yaml

    workflow = yaml.safe_load((Path(__file__).resolve().parents[2] / ".github/workflows/gpu-tests.yml").read_text())
    [plan] = [step for step in workflow["jobs"]["plan"]["steps"] if step.get("id") == "plan"]
    assert plan["env"]["PR"] == "${{ inputs.pr }}" and '"${untrusted[@]}"' in plan["run"]
    assert "untrusted=(--pull-request)" in plan["run"]


# ---------------------------------------------------------------- 2. uv's hard links


def test_uv_copies_files_out_of_its_cache(monkeypatch, tmp_path):
    """With hard links, editing an installed file in place edits uv's cache, and every later install
    (the rebuild "on any difference" included) gets the edited file."""
    commands: list[list[str]] = []
    monkeypatch.setattr(env, "run_logged", lambda command, log: commands.append(command))
    monkeypatch.setattr(env, "_uv", lambda: "/opt/uv/bin/uv")
    monkeypatch.setenv("HARNESS_INSTALLER", "uv")
    env.build(env.EnvSpec(torch="0.0.1", transformers="0.0.2"), tmp_path / "env", log=lambda line: None)
    [create, install] = commands
    assert create[:2] == ["/opt/uv/bin/uv", "venv"]
    assert install[:3] == ["/opt/uv/bin/uv", "pip", "install"] and "--link-mode=copy" in install


# ---------------------------------------------------------------- 3. bisect --repo commit environments


@pytest.fixture
def commit_builds(monkeypatch, tmp_path):
    """commit_environment over a stand-in cell environment and build: what a build leaves, in small."""
    builds: list[Path] = []
    base = env.Environment(python=Path(sys.executable), origin="cached", path=None, versions={})
    monkeypatch.setattr(env, "ensure_environment", lambda spec, root, log: base)
    monkeypatch.setattr(env, "probe_versions", lambda python: {})

    def build(repo, sha, base, path, source, log):
        builds.append(path)
        shutil.rmtree(path, ignore_errors=True)
        (path / "bin").mkdir(parents=True)
        (path / "bin" / "python").symlink_to(sys.executable)
        (path / "lib").mkdir()
        (path / "lib" / "tinypkg.py").write_text("VALUE = 1\n")

    monkeypatch.setattr(commits, "build", build)
    return builds


@pytest.mark.parametrize("tamper", [
    plant_pth,
    lambda path: (path / "lib" / "tinypkg.py").write_text("import os; os.system('id')\n"),
], ids=["planted-pth", "patched-module"])
def test_a_commit_environment_that_changed_is_rebuilt_not_reused(commit_builds, tmp_path, tamper):
    prepare, _will_build = commits.commit_environment(tmp_path / "repo", "a" * 40, "tinypkg")
    first = prepare(CELL, tmp_path / "envs", lambda line: None)
    assert first.origin == "built" and json.loads((first.path / commits.MARKER).read_text())["commit"] == "a" * 40
    assert prepare(CELL, tmp_path / "envs", lambda line: None).origin == "cached"
    tamper(first.path)
    again = prepare(CELL, tmp_path / "envs", lambda line: None)
    assert again.origin == "built" and len(commit_builds) == 2
    assert env.manifest_difference(again.path) is None and not (again.path / "lib" / "python3").exists()
