"""Per-cell environments: one virtual environment per (python, torch, transformers).

The current interpreter is used as it is when it already holds the cell's torch
and transformers (and the suite's pytest plugins); otherwise an environment is
built once under the cache folder and reused while its marker matches. uv is the
fast path, pip the fallback. Where packages come from is configuration:

  HARNESS_INSTALLER        uv | pip (default: uv when it is on PATH)
  HARNESS_INDEX_URL        replaces the default index (e.g. a CUDA torch index or a mirror)
  HARNESS_EXTRA_INDEX_URL  more indexes, space-separated
  HARNESS_FIND_LINKS       folders or pages of wheels, space-separated (default: $PIP_FIND_LINKS)
  HARNESS_INSTALLER_ARGS   anything else for the installer (shell-quoted)
  HARNESS_ENV_DIR          the cache folder (default ~/.cache/harness/envs)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from harness.matrix import Cell

# Besides the pinned torch and transformers, what the suite imports in its own environment.
SUITE_PACKAGES = ("accelerate>=1.10", "pytest>=8", "pytest-rerunfailures>=14", "pytest-timeout>=2.3")
MARKER = "harness-env.json"
TAIL_LINES = 12

# Runs inside the candidate interpreter; reads versions from package metadata so it
# never pays for importing torch. torch/version.py holds the CUDA version as a literal.
PROBE_SCRIPT = r"""
import json, re, sys
import importlib.metadata as md
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
cuda = None
try:
    text = md.distribution("torch").locate_file("torch/version.py").read_text()
    found = re.search(r"^cuda\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    cuda = found.group(1) if found else None
except Exception:
    pass
names = ["torch", "transformers", "accelerate", "pytest", "pytest-rerunfailures", "pytest-timeout"]
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "cuda": cuda,
                  **{n: version(n) for n in names}}))
"""


class EnvironmentBuildError(Exception):
    """The cell's environment could not be built; the message carries the installer's last lines."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Environment:
    python: Path
    origin: str  # "current" | "cached" | "built"
    path: Path | None
    versions: dict


def env_root(override: str | None = None) -> Path:
    if override:
        return Path(override).expanduser()
    if os.environ.get("HARNESS_ENV_DIR"):
        return Path(os.environ["HARNESS_ENV_DIR"]).expanduser()
    return Path.home() / ".cache" / "harness" / "envs"


def python_tag() -> str:
    return "{}.{}".format(*sys.version_info[:2])


def env_key(cell: Cell) -> str:
    return f"py{python_tag()}-torch{cell.torch}-tf{cell.transformers}"


def requirements(cell: Cell) -> list[str]:
    return [f"torch=={cell.torch}", f"transformers=={cell.transformers}", *SUITE_PACKAGES]


def probe_versions(python: Path | str) -> dict:
    """Versions of python, torch (and its CUDA), transformers and the pytest plugins in an interpreter."""
    done = subprocess.run([str(python), "-c", PROBE_SCRIPT], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise EnvironmentBuildError(f"{python}: cannot read package versions: {_tail(done.stderr)}")
    return json.loads(done.stdout)


def satisfies(versions: dict, cell: Cell) -> bool:
    """True when an interpreter holds exactly the cell's releases (local tags like +cpu ignored)."""
    def release(value: str | None) -> str | None:
        return value.split("+", 1)[0] if value else None

    plugins = ("accelerate", "pytest", "pytest-rerunfailures", "pytest-timeout")
    return (release(versions.get("torch")) == cell.torch
            and release(versions.get("transformers")) == cell.transformers
            and all(versions.get(name) for name in plugins))


def plan_environment(cell: Cell, root: Path) -> tuple[str, Path, Path | None]:
    """Which interpreter a cell gets, without building anything: (origin, python, venv folder or None),
    origin being "current" (this interpreter holds the releases), "cached" or "build"."""
    if satisfies(probe_versions(sys.executable), cell):
        return "current", Path(sys.executable), None
    path = root / env_key(cell)
    return ("cached" if _marker_matches(path, cell) else "build"), path / "bin" / "python", path


def ensure_environment(cell: Cell, root: Path, log: Callable[[str], None]) -> Environment:
    origin, python, path = plan_environment(cell, root)
    with contextlib.ExitStack() as held:
        if origin == "build":
            # Runners on one host share the cache: one run builds, the others wait, then find it cached.
            held.enter_context(_build_lock(path, log))
            origin, python, path = plan_environment(cell, root)
        if origin == "build":
            build(cell, path, log)
            origin = "built"
        return _checked(cell, origin, python, path)


def _checked(cell: Cell, origin: str, python: Path, path: Path | None) -> Environment:
    versions = probe_versions(python)
    if origin == "built":
        if not satisfies(versions, cell):
            raise EnvironmentBuildError(
                f"{path}: built, but holds torch {versions.get('torch')} and transformers "
                f"{versions.get('transformers')} instead of {cell.torch} and {cell.transformers}")
        (path / MARKER).write_text(json.dumps({"requirements": requirements(cell), "versions": versions}, indent=2))
    return Environment(python=python, origin=origin, path=path, versions=versions)


@contextlib.contextmanager
def _build_lock(path: Path, log: Callable[[str], None]) -> Iterator[None]:
    """Hold `<env>.lock` exclusively; the kernel lets go if this process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another harness run that is building environment {path.name}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build(cell: Cell, path: Path, log: Callable[[str], None]) -> None:
    if path.exists():
        shutil.rmtree(path)  # a stale or half-built environment; its marker did not match
    path.parent.mkdir(parents=True, exist_ok=True)
    installer = choose_installer()
    python = path / "bin" / "python"
    if installer == "uv":
        create = [_uv(), "venv", "--quiet", "--python", sys.executable, str(path)]
        # Compile bytecode once here, or every first import of torch in a fresh cache pays for it.
        install = [_uv(), "pip", "install", "--compile-bytecode", "--python", str(python)]
    else:
        create = [sys.executable, "-m", "venv", str(path)]
        install = [str(python), "-m", "pip", "install", "--progress-bar", "off"]
    install += index_arguments(installer) + requirements(cell)
    log(f"building environment {path.name} with {installer}: {' '.join(requirements(cell)[:2])}")
    for step in (create, install):
        _run_logged(step, log)


def choose_installer() -> str:
    chosen = os.environ.get("HARNESS_INSTALLER", "").strip()
    if chosen and chosen not in ("uv", "pip"):
        raise EnvironmentBuildError(f"HARNESS_INSTALLER={chosen!r}: expected uv or pip")
    if chosen:
        return chosen
    return "uv" if _uv() else "pip"


def index_arguments(installer: str, *, installer_args: bool = True) -> list[str]:
    """Where packages come from, as the installer's options; `installer_args` adds HARNESS_INSTALLER_ARGS
    (left out where another command asks the same index, e.g. `pip index versions`)."""
    arguments = []
    if os.environ.get("HARNESS_INDEX_URL"):
        arguments += ["--index-url", os.environ["HARNESS_INDEX_URL"]]
    for url in os.environ.get("HARNESS_EXTRA_INDEX_URL", "").split():
        arguments += ["--extra-index-url", url]
    # pip already reads PIP_FIND_LINKS; uv does not, so hand it over explicitly.
    find_links = os.environ.get("HARNESS_FIND_LINKS") or (
        os.environ.get("PIP_FIND_LINKS", "") if installer == "uv" else "")
    for location in find_links.split():
        arguments += ["--find-links", location]
    if installer == "uv" and len(arguments) > 2:
        # A CUDA torch index and PyPI both carry torch; take the best match, not the first index.
        arguments += ["--index-strategy", "unsafe-best-match"]
    return arguments + (shlex.split(os.environ.get("HARNESS_INSTALLER_ARGS", "")) if installer_args else [])


def _marker_matches(path: Path, cell: Cell) -> bool:
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("requirements") == requirements(cell) and (path / "bin" / "python").exists()


def _uv() -> str | None:
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.exists() else shutil.which("uv")


def _run_logged(command: list[str], log: Callable[[str], None]) -> None:
    lines: list[str] = []
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as error:
        raise EnvironmentBuildError(f"{command[0]}: {error.strerror}") from None
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip())
        log(line.rstrip())
    if process.wait() != 0:
        raise EnvironmentBuildError(f"{Path(command[0]).name} exited {process.returncode}: "
                                    f"{_tail(chr(10).join(lines))}")


def _tail(text: str) -> str:
    """The installer's own words: from its last line that says error (with its causes), else the last lines."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.lower().startswith("error")]
    chosen = lines[starts[-1]: starts[-1] + 4] if starts else lines[-3:]
    return " ".join(chosen)[:600] or "no output"
