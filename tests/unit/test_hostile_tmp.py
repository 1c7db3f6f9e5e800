"""Another local user against the folders harness makes at a known name (the GPU lock folder in the system's
temporary folder, a cell's credentials folder, Slurm's private folder in the project): what they plant at that
name first, a link to a folder of root's, a folder of their own, a link, a FIFO or a hard link as a lock file,
never makes a run as root change, lock or write anything behind it; each is refused in one line.

The other user is real: uid 65534 (nobody) makes the plants with the system's own tools. Their links sit in a
folder they own that is not sticky, so the kernel's fs.protected_symlinks (which, where it is 1, stops a link
in a sticky world-writable folder like /tmp from being followed) does not decide the outcome: harness must.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml
from run_helpers import write_packed_matrix

from harness.cell import gpulock
from harness.cli import main
from harness.engines import credentials, slurm
from harness.errors import ConfigError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="needs root: the attack is another user's plant against a run as root")

OTHER_USER = 65534  # nobody
SYSTEM_PYTHON = "/usr/bin/python3"  # the other user's interpreter: root's venv may not be theirs to run
UUID = "GPU-00000000-hostile-tmp"
ROOT_FOLDER_MODE = 0o755
DEADLINE_S = 120  # a lock attempt is a few milliseconds; this only stops one that waits on a FIFO forever


@dataclass(frozen=True)
class Ground:
    attacker: Path  # the other user's folder, 0755 and not sticky: links in it are followed whatever the sysctl
    roots: Path  # a folder of root's, 0755: what the plants point at
    shared: Path  # root's and sticky (1777), as /tmp is: where every user's runs lock


def as_other_user(*command: str) -> None:
    subprocess.run(command, user=OTHER_USER, group=OTHER_USER, extra_groups=[], cwd="/", check=True,
                   capture_output=True, timeout=DEADLINE_S)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def ground():
    base = Path(tempfile.mkdtemp(prefix="harness-hostile-tmp-", dir="/tmp"))  # reachable by the other user
    try:
        os.chmod(base, 0o755)
        attacker, roots, shared = base / "attacker", base / "roots", base / "shared"
        attacker.mkdir()
        os.chown(attacker, OTHER_USER, OTHER_USER)
        roots.mkdir()
        shared.mkdir()
        for folder, folder_mode in ((attacker, 0o755), (roots, ROOT_FOLDER_MODE), (shared, 0o1777)):
            os.chmod(folder, folder_mode)
        (roots / "root-owned.txt").write_text("root's\n")
        yield Ground(attacker, roots, shared)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def assert_roots_folder_as_it_was(ground: Ground) -> None:
    now = mode(ground.roots)
    assert now == ROOT_FOLDER_MODE, f"root's folder is now {oct(now)}, was {oct(ROOT_FOLDER_MODE)}"
    assert sorted(os.listdir(ground.roots)) == ["root-owned.txt"], "something was written in root's folder"


def lock_as_root() -> object:
    """What the real lock path gives a run as root: the ConfigError it raised, or what it returned (released)."""
    try:
        outcome = gpulock.try_lock([UUID])
    except ConfigError as error:
        return error
    if isinstance(outcome, gpulock.GpuLocks):
        outcome.release()
    return outcome


def one_line_refusal(outcome: object, *words: str) -> str:
    assert isinstance(outcome, ConfigError), f"not refused: {outcome!r}"
    message = str(outcome)
    assert "\n" not in message and all(word in message for word in words), message
    return message


@pytest.mark.parametrize("named_by", ["TMPDIR", gpulock.LOCK_DIR_ENV])
def test_a_link_planted_at_the_gpu_lock_folder_leaves_roots_folder_as_it_was(ground, monkeypatch, named_by):
    link = ground.attacker / "harness-gpu-locks"
    as_other_user("ln", "-s", str(ground.roots), str(link))
    if named_by == "TMPDIR":  # the default: harness-gpu-locks in the system's temporary folder
        monkeypatch.delenv(gpulock.LOCK_DIR_ENV, raising=False)
        monkeypatch.setenv("TMPDIR", str(ground.attacker))
        monkeypatch.setattr(tempfile, "tempdir", str(ground.attacker))  # gettempdir() read TMPDIR long ago
    else:
        monkeypatch.setenv(gpulock.LOCK_DIR_ENV, str(link))
    assert gpulock.lock_dir() == link

    outcome = lock_as_root()

    assert_roots_folder_as_it_was(ground)  # 3d3554e: chmod'ed 0o1777, the lock file created in it
    one_line_refusal(outcome, str(link), "GPU lock folder", "symbolic link", gpulock.LOCK_DIR_ENV)


def test_another_users_gpu_lock_folder_is_refused(ground, monkeypatch):
    """Its owner may remove or swap any file in it, sticky or not: root's run locks nothing there."""
    folder = ground.attacker / "harness-gpu-locks"
    as_other_user("mkdir", "-m", "1777", str(folder))
    monkeypatch.setenv(gpulock.LOCK_DIR_ENV, str(folder))

    outcome = lock_as_root()

    assert os.listdir(folder) == []  # 3d3554e: root's lock file, in a folder the other user controls
    one_line_refusal(outcome, str(folder), f"uid {OTHER_USER}", "sticky")


LOCK_IN_A_SUBPROCESS = (
    "import sys\n"
    "from harness.cell import gpulock\n"
    "from harness.errors import ConfigError\n"
    "try:\n"
    "    outcome = gpulock.try_lock([sys.argv[1]])\n"
    "except ConfigError as error:\n"
    "    print('refused:', error)\n"
    "else:\n"
    "    print('locked' if isinstance(outcome, gpulock.GpuLocks) else f'not locked: {outcome}')\n"
)


def lock_in_a_subprocess(user: int | None, python: str, folder: Path) -> str:
    """The lock path in a process of its own (`user`: None, root), its one line: one that waits on a FIFO forever
    fails here at the deadline instead of hanging the suite."""
    environ = {**os.environ, gpulock.LOCK_DIR_ENV: str(folder), "PYTHONPATH": str(Path(gpulock.__file__).parents[2])}
    done = subprocess.run([python, "-c", LOCK_IN_A_SUBPROCESS, UUID], env=environ, cwd="/", user=user,
                          group=user, extra_groups=None if user is None else [], capture_output=True, text=True,
                          timeout=DEADLINE_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("plant", ["symlink", "fifo", "hardlink"])
def test_a_lock_file_another_user_planted_in_the_shared_folder_is_refused(ground, plant):
    """In root's sticky folder every user may create the lock files: one planted as a link to root's file, as a
    FIFO (an open for reading would wait forever) or as a second name of a file elsewhere is never locked."""
    lock = ground.shared / f"{UUID}.lock"
    target = ground.roots / "root-owned.txt"
    if plant == "symlink":
        as_other_user("ln", "-s", str(target), str(lock))
    elif plant == "fifo":
        as_other_user("mkfifo", "-m", "0666", str(lock))
    else:
        as_other_user("sh", "-c", f"echo theirs > {ground.attacker}/elsewhere && ln {ground.attacker}/elsewhere {lock}")
    before = os.stat(target)

    try:
        line = lock_in_a_subprocess(None, sys.executable, ground.shared)
    except subprocess.TimeoutExpired:
        pytest.fail(f"root's lock waited {DEADLINE_S} s on the planted {plant}")

    assert line.startswith("refused: ") and "lock file" in line, line  # 3d3554e: 'locked', or 'not locked: ...'
    after = os.stat(target)
    assert (after.st_mode, after.st_size, after.st_mtime_ns) == (before.st_mode, before.st_size, before.st_mtime_ns)


@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"needs {SYSTEM_PYTHON} for the other user")
def test_runs_of_two_users_still_exclude_each_other_in_roots_sticky_folder(ground, monkeypatch):
    """What the refusals keep: a folder of root's with the sticky bit is every user's, and a GPU one run holds is
    busy for the other user's run."""
    monkeypatch.setenv(gpulock.LOCK_DIR_ENV, str(ground.shared))
    held = gpulock.try_lock([UUID])
    assert isinstance(held, gpulock.GpuLocks), held
    try:
        line = lock_in_a_subprocess(OTHER_USER, SYSTEM_PYTHON, ground.shared)
    finally:
        held.release()
    assert line.startswith(f"not locked: GPU {UUID} is held by another harness run"), line
    assert lock_in_a_subprocess(OTHER_USER, SYSTEM_PYTHON, ground.shared) == "locked"
    assert oct(mode(ground.shared)) == oct(0o1777)


def test_a_link_planted_at_a_credentials_folder_leaves_roots_folder_as_it_was(ground):
    link = ground.attacker / "private"
    as_other_user("ln", "-s", str(ground.roots), str(link))

    try:
        outcome: object = credentials.write(link, "hostile-tmp")
    except ConfigError as error:
        outcome = error

    assert_roots_folder_as_it_was(ground)  # 3d3554e: chmod'ed 0o700, the cell's key written into it
    one_line_refusal(outcome, str(link), "credentials", "symbolic link")


def test_another_users_folder_at_slurms_private_folder_is_refused(ground):
    """A project folder another user may write in: their folder at harness's private name would hold the cell's
    key (root may write in any folder, and would chmod theirs 0700 to do it)."""
    project = ground.attacker
    as_other_user("mkdir", "-m", "0755", str(project / slurm.PRIVATE_FOLDER))

    try:
        outcome: object = slurm.private_folder(project)
    except ConfigError as error:
        outcome = error

    assert oct(mode(project / slurm.PRIVATE_FOLDER)) == oct(0o755)  # 3d3554e: 0o700, and returned for the key
    one_line_refusal(outcome, str(project / slurm.PRIVATE_FOLDER), f"uid {OTHER_USER}")


def test_harness_run_as_root_stops_at_the_planted_lock_folder_in_one_line(ground, tmp_path, monkeypatch, capsys):
    """The whole command: `harness run` on a host whose temporary folder holds the other user's link stops
    before any cell runs, exit 2, one line; root's folder keeps its mode."""
    as_other_user("ln", "-s", str(ground.roots), str(ground.attacker / "harness-gpu-locks"))
    monkeypatch.delenv(gpulock.LOCK_DIR_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(ground.attacker))
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(uuid=UUID)]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_never.py").write_text("def test_never_runs():\n    raise AssertionError('the cell ran')\n")
    h200 = {"labels": ["gpu-h200"], "gpus": 1, "nvml_name": "NVIDIA H200"}
    matrix = write_packed_matrix(tmp_path / "m", [str(suite)], {"h200": h200}, gpus=[1])
    capsys.readouterr()

    try:
        code: object = main(["run", "--matrix", matrix, "--results", str(tmp_path / "results"),
                             "--env-dir", str(tmp_path / "envs")])
    except Exception as error:  # what became of root's folder is the first thing to tell
        code = error

    assert_roots_folder_as_it_was(ground)  # 3d3554e: chmod'ed 0o1777, and the cell ran
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("harness: error:")]
    assert code == 2 and len(errors) == 1, (code, errors)
    assert "harness-gpu-locks: refused as the GPU lock folder" in errors[0] and "symbolic link" in errors[0], errors
