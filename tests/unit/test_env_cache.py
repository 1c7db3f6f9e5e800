"""`harness env list|clean` over a real cache layout, a build's markers, and a failed build removed at once."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys

import pytest
from env_helpers import BUILDING_MARKER, CELL_MARKER, SPEC, cached_environment

from harness.cli import main
from harness.envs import build as env


@pytest.fixture
def cache(tmp_path):
    root = tmp_path / "envs"
    cached_environment(root, "py3.11-torch2.13.0-tf5.24.0")
    cached_environment(root, "py3.11-torch2.12.0-tf5.20.0", days_unused=45)
    cached_environment(root, "py3.11-torch2.11.0-tf5.9.0", complete=False)
    return root


def test_list_shows_kind_size_versions_and_last_use(cache, capsys):
    assert main(["env", "list", "--env-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"3 environments in {cache}, ")
    assert "cell: torch 2.13.0+cpu, transformers 5.24.0, python 3.11.7" in out
    assert "(45 d ago)" in out and "(today)" in out
    assert "interrupted build  cell, incomplete (harness 0.1.0, started 2026-01-01T00:00)" in out
    assert "not harness's" not in out
    assert all(len(line) <= 120 for line in out.splitlines())


def test_clean_removes_interrupted_builds_and_long_unused_ones(cache, capsys):
    assert main(["env", "clean", "--env-dir", str(cache), "--dry-run"]) == 0
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 3
    assert main(["env", "clean", "--env-dir", str(cache)]) == 0
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == ["py3.11-torch2.13.0-tf5.24.0"]
    out = capsys.readouterr().out
    assert "removed py3.11-torch2.11.0-tf5.9.0 (" in out and "interrupted build)" in out
    assert "unused for more than 30 days)" in out


def test_clean_all_removes_everything_but_a_build_in_progress(cache, capsys):
    building = cache / "py3.11-torch2.13.0-tf5.24.0"
    with open(building.with_name(building.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another harness run is building it
        assert main(["env", "clean", "--env-dir", str(cache), "--all"]) == 0
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [building.name]
    assert f"kept {building.name}: a build of it is running" in capsys.readouterr().out


def test_a_negative_age_is_one_line_and_exit_2(cache, capsys):
    assert main(["env", "clean", "--env-dir", str(cache), "--unused-days", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "harness: error: --unused-days -1: expected a number of days >= 0"


def test_a_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    calls = []

    def run_logged(command, log):
        calls.append(command)
        if len(calls) == 1:  # the venv is created, then the install fails
            (path / "bin").mkdir(parents=True)
            (path / "bin" / "big").write_bytes(b"x" * 1_000_000)
            return
        raise env.EnvironmentBuildError("uv exited 1: No solution found: torch==0.0.1")

    path = tmp_path / "envs" / env.env_key(SPEC)
    monkeypatch.setattr(env, "run_logged", run_logged)
    with pytest.raises(env.EnvironmentBuildError):
        env.build(SPEC, path, log=lambda line: None)
    assert len(calls) == 2 and not path.exists()


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_build_marks_its_folder_before_any_installer_runs_and_completes_the_mark_at_the_end(
        tmp_path, monkeypatch, installer):
    seen: list[list[str]] = []

    def run_logged(command, log):
        seen.append(sorted(entry.name for entry in path.iterdir()))
        if len(seen) == 1:
            (path / "bin").mkdir()
            (path / "bin" / "python").symlink_to(sys.executable)

    path = tmp_path / "envs" / env.env_key(SPEC)
    monkeypatch.setattr(env, "run_logged", run_logged)
    monkeypatch.setattr(env, "_uv", lambda: "/opt/uv/bin/uv")
    monkeypatch.setenv("HARNESS_INSTALLER", installer)
    (path / "lib").mkdir(parents=True)  # what an earlier build left: it goes first
    env.build(SPEC, path, log=lambda line: None)
    assert seen[0] == [BUILDING_MARKER]  # the venv is created into a folder that says whose it is
    building = json.loads((path / BUILDING_MARKER).read_text())
    assert building["kind"] == "cell" and building["harness"] == "0.1.0" and "torch==0.0.1" in building["building"]
    monkeypatch.setattr(env, "probe_versions", lambda python: {
        "torch": "0.0.1", "transformers": "0.0.2", "accelerate": "1", "pytest": "8", "pytest-rerunfailures": "14",
        "pytest-timeout": "2"})
    env._checked(SPEC, "built", path / "bin" / "python", path)
    assert not (path / BUILDING_MARKER).exists()
    assert json.loads((path / CELL_MARKER).read_text())["kind"] == "cell"
    assert env.manifest_difference(path) is None


BUILD_THEN_HANG = """
import sys
from pathlib import Path
from harness.envs import build as env

def run_logged(command, log):
    print("installing", flush=True)
    sys.stdin.read()  # an installer that runs until this process is killed

env.run_logged = run_logged
path = Path(sys.argv[1])
with env.build_lock(path, lambda line: None):
    env.build(env.EnvSpec(torch="0.0.1", transformers="0.0.2"), path, lambda line: None)
"""


def test_a_build_running_in_another_process_is_kept_and_removed_once_that_process_was_killed(tmp_path, capsys):
    """A real harness process building (its lock held, its building marker written), then killed with
    SIGKILL (nothing of it cleans up): the same folder is kept, then goes as an interrupted build."""
    root = tmp_path / "envs"
    path = root / env.env_key(SPEC)
    builder = subprocess.Popen([sys.executable, "-c", BUILD_THEN_HANG, str(path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "HARNESS_INSTALLER": "pip"})
    try:
        assert builder.stdout.readline() == "installing\n"
        assert main(["env", "list", "--env-dir", str(root)]) == 0
        assert "being built  cell, incomplete" in capsys.readouterr().out
        assert main(["env", "clean", "--env-dir", str(root), "--all"]) == 0
        assert f"kept {path.name}: a build of it is running" in capsys.readouterr().out
        assert (path / BUILDING_MARKER).is_file()
    finally:
        builder.send_signal(signal.SIGKILL)
        builder.wait(timeout=60)
    assert main(["env", "clean", "--env-dir", str(root)]) == 0
    assert f"removed {path.name} (" in capsys.readouterr().out and not path.exists()
