"""The environment trust model against the attacks of a pull request's code (same user as the runner):
planting code in a cached environment and re-recording its manifest, editing an installed file that uv
hard-linked from its cache, and planting code in a `bisect --repo` commit environment; and `harness env
clean` pointed at what is not its own (another tool's cache, bisect's environments, links out of the cache)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from env_helpers import BUILDING_MARKER, CELL, CELL_MARKER, cached_environment, tree
from tamper import plant_pth

from harness.bisect import commits
from harness.cli import main
from harness.envs import build as env
from harness.envs import markers

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


@pytest.mark.parametrize("gpu", ["ada", "h100", "h200", "gb200"])
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

    def build(repo, sha, base, path, log):
        builds.append(path)
        assert [entry.name for entry in path.iterdir()] == [BUILDING_MARKER]  # new, and marked before building
        (path / "bin").mkdir()
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


# ---------------------------------------------------------------- 4. env clean removes only what is its own


def fake_home_cache(tmp_path: Path) -> Path:
    """~/.cache as other tools leave it, with harness's own cache somewhere below it."""
    home_cache = tmp_path / "home" / ".cache"
    for tool, file in [("pip", "http-v2/ab/cd"), ("uv", "wheels-v5/torch.whl"),
                       ("huggingface", "hub/models--org--model/blobs/abc"), ("torch", "kernels/k.bin")]:
        (home_cache / tool / file).parent.mkdir(parents=True)
        (home_cache / tool / file).write_bytes(b"x" * 1000)
    cached_environment(home_cache / "harness" / "envs", "py3.11-torch2.13.0-tf5.24.0", days_unused=90)
    return home_cache


@pytest.mark.parametrize("options", [[], ["--all"], ["--all", "--include-bisect", "--unused-days", "0"]],
                         ids=["default", "all", "everything"])
def test_clean_pointed_at_a_home_cache_removes_nothing_and_exits_2(tmp_path, capsys, options):
    home_cache = fake_home_cache(tmp_path)
    before = tree(home_cache)
    assert main(["env", "clean", "--env-dir", str(home_cache), *options]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"harness: error: {home_cache}: ")
    assert ("not a harness environment cache, nothing removed: no harness marker on "
            "harness, huggingface, pip, torch, uv (another tool's?)") in captured.err
    assert tree(home_cache) == before  # nothing removed, and no lock file made beside another tool's folder


def test_list_of_a_home_cache_names_what_is_not_harness_and_does_not_walk_it(tmp_path, capsys):
    home_cache = fake_home_cache(tmp_path)
    assert main(["env", "list", "--env-dir", str(home_cache)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [f"no environments in {home_cache}", "not harness's (no marker; env clean refuses "
                                "this folder): harness, huggingface, pip, torch, uv"]


@pytest.mark.parametrize("name", ["py3.11-torch2.11.0-tf5.9.0", "pip"])
def test_a_folder_without_a_marker_is_never_removed_whatever_its_name(tmp_path, capsys, name):
    root = tmp_path / "envs"
    cached_environment(root, "py3.11-torch2.13.0-tf5.24.0", days_unused=90)
    (root / name / "bin").mkdir(parents=True)  # no marker: an old harness's leftover, or another tool's
    before = tree(root)
    assert main(["env", "clean", "--env-dir", str(root), "--all"]) == 2
    assert f"nothing removed: no harness marker on {name} (another tool's?)" in capsys.readouterr().err
    assert tree(root) == before


def test_an_interrupted_build_goes_and_one_whose_lock_is_held_stays(tmp_path, capsys):
    import fcntl

    root = tmp_path / "envs"
    interrupted = cached_environment(root, "py3.11-torch2.11.0-tf5.9.0", complete=False)
    running = cached_environment(root, "py3.11-torch2.12.0-tf5.20.0", complete=False)
    with open(root / f"{running.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert main(["env", "clean", "--env-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"removed {interrupted.name} (" in out and not interrupted.exists()
    assert f"kept {running.name}: a build of it is running" in out and (running / BUILDING_MARKER).is_file()


def test_bisect_commit_environments_are_kept_unless_asked(tmp_path, capsys):
    root = tmp_path / "envs"
    cell = cached_environment(root, "py3.11-torch2.13.0-tf5.24.0", days_unused=90)
    commit = cached_environment(root, f"{cell.name}-tinypkg@{'a' * 12}", kind="bisect-commit", days_unused=90)
    half = cached_environment(root, f"{cell.name}-tinypkg@{'b' * 12}", kind="bisect-commit", complete=False)
    assert main(["env", "list", "--env-dir", str(root)]) == 0
    assert f"bisect-commit: tinypkg {'a' * 12}" in capsys.readouterr().out
    assert main(["env", "clean", "--env-dir", str(root), "--all"]) == 0
    out = capsys.readouterr().out
    assert not cell.exists() and commit.is_dir() and half.is_dir()
    assert "kept 2 bisect commit environments (--include-bisect removes them too)" in out
    assert main(["env", "clean", "--env-dir", str(root), "--include-bisect"]) == 0  # unused 90 days, interrupted
    assert not commit.exists() and not half.exists()


def test_a_linked_environment_is_never_followed(tmp_path, capsys):
    """A link in the cache to a folder elsewhere that carries a (long unused) marker: the folder it points
    to is not harness's cache to empty."""
    root, elsewhere = tmp_path / "envs", tmp_path / "elsewhere"
    target = cached_environment(elsewhere, "py3.11-torch2.13.0-tf5.24.0", days_unused=90)
    root.mkdir()
    (root / target.name).symlink_to(target)
    before = tree(tmp_path)
    assert main(["env", "clean", "--env-dir", str(root), "--all"]) == 2
    assert f"no harness marker on {target.name} (a link)" in capsys.readouterr().err
    assert tree(tmp_path) == before


def test_a_linked_marker_makes_no_folder_harness(tmp_path, capsys):
    """A real folder (another tool's) given harness's marker by a link to one elsewhere."""
    root = tmp_path / "envs"
    real = cached_environment(tmp_path / "elsewhere", "py3.11-torch2.13.0-tf5.24.0", days_unused=90)
    (root / "pip" / "wheels").mkdir(parents=True)
    (root / "pip" / CELL_MARKER).symlink_to(real / CELL_MARKER)
    before = tree(tmp_path)
    assert main(["env", "clean", "--env-dir", str(root), "--all"]) == 2
    assert "nothing removed: no harness marker on pip (" in capsys.readouterr().err
    assert tree(tmp_path) == before


def test_a_link_inside_an_environment_goes_with_it_and_what_it_points_to_stays(tmp_path, capsys):
    root, outside = tmp_path / "envs", tmp_path / "outside"
    (outside / "data").mkdir(parents=True)
    (outside / "data" / "keep").write_text("not harness's")
    removed = cached_environment(root, "py3.11-torch2.13.0-tf5.24.0", days_unused=90)
    (removed / "lib" / "data").symlink_to(outside / "data")
    assert main(["env", "clean", "--env-dir", str(root)]) == 0
    assert not removed.exists() and (outside / "data" / "keep").read_text() == "not harness's"


def test_a_lock_that_is_a_link_is_never_opened_through(tmp_path, capsys):
    """Opening `<env>.lock` through a link would create or lock a file elsewhere: a link where a lock goes
    refuses the root, and nothing is made or removed. A build that meets one stops with its name."""
    root, outside = tmp_path / "envs", tmp_path / "outside"
    outside.mkdir()
    locked = cached_environment(root, "py3.11-torch2.12.0-tf5.20.0", days_unused=90)
    (root / f"{locked.name}.lock").symlink_to(outside / "victim")
    before = tree(tmp_path)
    assert main(["env", "clean", "--env-dir", str(root)]) == 2
    assert f"no harness marker on {locked.name}.lock (a link)" in capsys.readouterr().err
    assert tree(tmp_path) == before and not (outside / "victim").exists()
    with pytest.raises(env.EnvironmentBuildError, match=f"{locked.name}.lock: cannot lock it"), \
            env.build_lock(locked, log=print):
        pass
    with markers.exclusive(locked) as busy:  # a link that appears after clean looked at the root
        assert busy == f"its lock {locked.name}.lock is a link or not a regular file"
    assert not (outside / "victim").exists()
