"""`harness env list|clean` over a real cache layout, and a failed build removed at once."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest
from env_helpers import SPEC

from harness.cli import main
from harness.envs import build as env

VERSIONS = {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.24.0"}


def make_environment(root: Path, name: str, *, complete: bool = True, days_unused: float = 0,
                     size: int = 100_000) -> Path:
    path = root / name
    (path / "lib").mkdir(parents=True)
    (path / "lib" / "blob").write_bytes(b"x" * size)
    if complete:
        (path / env.MARKER).write_text(json.dumps({"requirements": ["torch==2.13.0"], "versions": VERSIONS}))
        used = time.time() - days_unused * 86_400
        os.utime(path / env.MARKER, (used, used))
    return path


@pytest.fixture
def cache(tmp_path):
    root = tmp_path / "envs"
    make_environment(root, "py3.11-torch2.13.0-tf5.24.0")
    make_environment(root, "py3.11-torch2.12.0-tf5.20.0", days_unused=45)
    make_environment(root, "py3.11-torch2.11.0-tf5.9.0", complete=False)
    return root


def test_list_shows_size_versions_and_last_use(cache, capsys):
    assert main(["env", "list", "--env-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"3 environments in {cache}, ")
    assert "torch 2.13.0+cpu, transformers 5.24.0, python 3.11.7" in out
    assert "(45 d ago)" in out and "(today)" in out
    assert "last use failed build  incomplete: no marker" in out
    assert all(len(line) <= 120 for line in out.splitlines())


def test_clean_removes_failed_builds_and_long_unused_ones(cache, capsys):
    assert main(["env", "clean", "--env-dir", str(cache), "--dry-run"]) == 0
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 3
    assert main(["env", "clean", "--env-dir", str(cache)]) == 0
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == ["py3.11-torch2.13.0-tf5.24.0"]
    out = capsys.readouterr().out
    assert "removed py3.11-torch2.11.0-tf5.9.0 (" in out and "failed build)" in out
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
