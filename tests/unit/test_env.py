"""Per-cell environments: which interpreter a cell gets, and one build when runs share the cache."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from env_helpers import SPEC
from tamper import plant_pth

from harness.envs import build as env

CELL_VERSIONS = {"torch": "0.0.1+cpu", "transformers": "0.0.2", "accelerate": "1.10.0", "pytest": "8.0.0",
                 "pytest-rerunfailures": "14.0", "pytest-timeout": "2.3.1"}


@pytest.fixture
def fake_builds(monkeypatch):
    """`build` makes a venv whose python is this one, slowly; the probe says it holds the cell's releases."""
    builds: list[Path] = []

    def build(spec, path, log):
        builds.append(path)
        time.sleep(0.5)  # long enough for a second run to arrive while this one builds
        (path / "bin").mkdir(parents=True)
        (path / "bin" / "python").symlink_to(sys.executable)

    def probe(python):
        return {"torch": "9.9.9"} if str(python) == sys.executable else CELL_VERSIONS

    monkeypatch.setattr(env, "build", build)
    monkeypatch.setattr(env, "probe_versions", probe)
    return builds


def test_an_interpreter_with_the_cells_releases_is_used_as_it_is(monkeypatch, tmp_path):
    monkeypatch.setattr(env, "probe_versions", lambda python: CELL_VERSIONS)
    origin, python, path = env.plan_environment(SPEC, tmp_path)
    assert (origin, python, path) == ("current", Path(sys.executable), None)


def test_an_environment_is_built_once_then_cached(fake_builds, tmp_path):
    first = env.ensure_environment(SPEC, tmp_path, log=lambda line: None)
    again = env.ensure_environment(SPEC, tmp_path, log=lambda line: None)
    assert (first.origin, again.origin) == ("built", "cached")
    assert fake_builds == [tmp_path / env.env_key(SPEC)]


def test_two_runs_sharing_the_cache_build_it_once_and_the_second_waits(fake_builds, tmp_path):
    origins: list[str] = []
    logs: list[str] = []

    def run():
        origins.append(env.ensure_environment(SPEC, tmp_path, log=logs.append).origin)

    runs = [threading.Thread(target=run) for _ in range(2)]
    for each in runs:
        each.start()
        time.sleep(0.1)  # the first holds the lock before the second asks
    for each in runs:
        each.join(10)
    assert sorted(origins) == ["built", "cached"]
    assert len(fake_builds) == 1
    assert logs == [f"waiting for another harness run that is building environment {env.env_key(SPEC)}"]


def test_a_build_that_fails_lets_the_next_run_build(fake_builds, monkeypatch, tmp_path):
    def broken(cell, path, log):
        raise env.EnvironmentBuildError("uv exited 1: no such torch")

    with monkeypatch.context() as patched:
        patched.setattr(env, "build", broken)
        with pytest.raises(env.EnvironmentBuildError):
            env.ensure_environment(SPEC, tmp_path, log=lambda line: None)
    assert env.ensure_environment(SPEC, tmp_path, log=lambda line: None).origin == "built"


# ---------------------------------------------------------------------------------------------
# Trust: code planted in a cached environment never runs in a later run


@pytest.fixture
def file_builds(fake_builds, monkeypatch):
    """`build` as the real one does it, in small: the old folder goes, a venv's files come."""

    def build(spec, path, log):
        fake_builds.append(path)
        shutil.rmtree(path, ignore_errors=True)
        (path / "bin").mkdir(parents=True)
        (path / "bin" / "python").symlink_to(sys.executable)
        (path / "bin" / "activate").write_text("# the venv's own\n")

    monkeypatch.setattr(env, "build", build)
    return fake_builds


@pytest.mark.parametrize(
    "tamper",
    [
        plant_pth,  # added
        lambda path: (path / "bin" / "activate").write_text("# changed\n"),
        lambda path: (path / "bin" / "activate").unlink(),
        lambda path: ((path / "bin" / "python").unlink(), (path / "bin" / "python").symlink_to("/bin/sh")),
        lambda path: (path / env.MANIFEST).write_text("{}"),  # the manifest rewritten to match nothing
    ],
    ids=["added", "changed", "removed", "relinked", "manifest"],
)
def test_a_cached_environment_that_changed_is_rebuilt(file_builds, tmp_path, tamper):
    built = env.ensure_environment(SPEC, tmp_path, log=lambda line: None)
    assert env.manifest_difference(built.path) is None
    tamper(built.path)
    logs: list[str] = []
    again = env.ensure_environment(SPEC, tmp_path, log=logs.append)
    assert again.origin == "built" and len(file_builds) == 2
    assert "changed since it was built" in logs[0]
    assert not (built.path / "lib").exists()  # a planted file went with the old environment
    assert env.ensure_environment(SPEC, tmp_path, log=lambda line: None).origin == "cached"


def test_an_environment_without_a_manifest_is_not_trusted(file_builds, tmp_path):
    built = env.ensure_environment(SPEC, tmp_path, log=lambda line: None)
    (built.path / env.MANIFEST).unlink()  # a cache from before manifests, or a run deleted it
    assert env.manifest_difference(built.path) == "no readable manifest"
    assert env.ensure_environment(SPEC, tmp_path, log=lambda line: None).origin == "built"


INTERRUPTED_BUILD = """
import signal, sys
from harness.engines import Interrupted, interruptible
from harness.envs.build import run_logged

with interruptible():
    try:
        run_logged(["sh", "-c", "echo $$ > {pid_file}; echo started; exec sleep 600"], print)
    except Interrupted:
        sys.exit(143)
"""


def test_an_interrupted_build_stops_its_installer(tmp_path):
    """SIGTERM while the installer runs (harness run and harness bisect take it as `Interrupted`): the installer is
    gone before harness exits, not left behind as an orphan."""
    import signal
    import subprocess

    from process_helpers import is_alive

    pid_file = tmp_path / "installer.pid"
    harness = subprocess.Popen([sys.executable, "-c", INTERRUPTED_BUILD.format(pid_file=pid_file)],
                               stdout=subprocess.PIPE, text=True)
    assert harness.stdout.readline().strip() == "started"  # the installer runs, its pid written first
    installer = int(pid_file.read_text())
    harness.send_signal(signal.SIGTERM)
    assert harness.wait(timeout=120) == 143
    assert not is_alive(installer)


GRACEFUL_BUILD = """
import sys
from harness.engines import Interrupted, interruptible
from harness.envs.build import run_logged

with interruptible():
    try:
        run_logged(["sh", "-c", "trap 'echo took SIGTERM > {seen}; kill $!; exit 143' TERM; echo $$ > {pid_file}; "
                                "echo started; sleep 600 & wait"], print)
    except Interrupted:
        sys.exit(143)
"""


def test_an_interrupted_installer_takes_sigterm_although_harness_blocks_it(tmp_path):
    """harness run blocks SIGTERM to learn who sends it, and a child inherits the blocked mask: the installer must
    still take stop()'s SIGTERM (its own cleanup runs), not wait out the grace for a SIGKILL."""
    import signal
    import subprocess

    from process_helpers import is_alive

    pid_file, seen = tmp_path / "installer.pid", tmp_path / "seen"
    harness = subprocess.Popen([sys.executable, "-c", GRACEFUL_BUILD.format(pid_file=pid_file, seen=seen)],
                               stdout=subprocess.PIPE, text=True)
    assert harness.stdout.readline().strip() == "started"
    installer = int(pid_file.read_text())
    harness.send_signal(signal.SIGTERM)
    assert harness.wait(timeout=120) == 143
    assert not is_alive(installer)
    assert seen.read_text().strip() == "took SIGTERM"


def test_an_installer_that_is_not_there_is_named(tmp_path):
    from harness.envs.build import EnvironmentBuildError, run_logged

    with pytest.raises(EnvironmentBuildError, match="no-such-installer: No such file or directory"):
        run_logged([str(tmp_path / "no-such-installer"), "install"], print)
