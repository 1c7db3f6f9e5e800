"""Per-cell environments: one virtual environment per (python, torch, transformers).

The current interpreter is used as it is when it already holds the cell's torch
and transformers (and the suite's pytest plugins); otherwise an environment is
built once under the cache folder and reused while its marker matches. uv is the
fast path, pip the fallback. Where packages come from is configuration:

  HARNESS_INSTALLER        uv | pip (default: uv when it is on PATH)
  HARNESS_INDEX_URL, HARNESS_EXTRA_INDEX_URL, HARNESS_FIND_LINKS, HARNESS_INSTALLER_ARGS: see harness.plan.index
  HARNESS_ENV_DIR          the cache folder (default ~/.cache/harness/envs)

Trust: a cached environment is used only while every file in it is the file its build wrote. The build
records a manifest (sha256 of every file, the target of every link); each later use checks it first and
rebuilds on any difference, so code a pull request's run planted in the cache (a `.pth` file, a patched
module, a `__pycache__` entry) never runs in a later run. Cells run with PYTHONDONTWRITEBYTECODE so an
honest run leaves its environment as built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from harness.containment.tether import tethered
from harness.environment import ENV_DIR_ENV, INSTALLER_ENV
from harness.envs import markers
from harness.plan.index import index_arguments

# Besides the pinned torch and transformers, what the suite imports in its own environment.
SUITE_PACKAGES = ("accelerate>=1.10", "pytest>=8", "pytest-rerunfailures>=14", "pytest-timeout>=2.3")
MARKER = markers.COMPLETE[markers.CELL]
MANIFEST = "harness-manifest.json"
_HASH_CHUNK = 1024 * 1024
# Harness's own records beside what a build wrote: markers (touched at each use) and the manifest itself.
_NOT_FINGERPRINTED = frozenset({MANIFEST, markers.BUILDING, *markers.COMPLETE.values()})
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


# Runs inside the candidate interpreter: "yes" when every (name, specifier) is installed and matches.
HOLDS_SCRIPT = r"""
import json, sys
import importlib.metadata as md
from packaging.specifiers import SpecifierSet
for name, specifier in json.loads(sys.argv[1]):
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        print("no"); sys.exit()
    if specifier and version not in SpecifierSet(specifier):
        print("no"); sys.exit()
print("yes")
"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvSpec:
    """What an environment holds besides the suite's packages: the torch and transformers releases and the
    `install:` entries (pip arguments, local paths already absolute). Callers make one from a cell: nothing
    else a cell says (its GPUs, suite, timeouts) may change which environment it gets."""

    torch: str
    transformers: str
    install: tuple[str, ...] = ()


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
    if os.environ.get(ENV_DIR_ENV):
        return Path(os.environ[ENV_DIR_ENV]).expanduser()
    return Path.home() / ".cache" / "harness" / "envs"


def python_tag() -> str:
    return "{}.{}".format(*sys.version_info[:2])


def env_key(spec: EnvSpec) -> str:
    key = f"py{python_tag()}-torch{spec.torch}-tf{spec.transformers}"
    if spec.install:
        # What else it installs is part of the key (local paths are absolute, so repositories differ).
        key += "-" + hashlib.sha256(json.dumps(spec.install).encode()).hexdigest()[:10]
    return key


def requirements(spec: EnvSpec) -> list[str]:
    extra = [argument for entry in spec.install for argument in shlex.split(entry)]
    return [f"torch=={spec.torch}", f"transformers=={spec.transformers}", *SUITE_PACKAGES, *extra]


def probe_versions(python: Path | str) -> dict:
    """Versions of python, torch (and its CUDA), transformers and the pytest plugins in an interpreter."""
    done = subprocess.run([str(python), "-c", PROBE_SCRIPT], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise EnvironmentBuildError(f"{python}: cannot read package versions: {_tail(done.stderr)}")
    return json.loads(done.stdout)


def satisfies(versions: dict, spec: EnvSpec) -> bool:
    """True when an interpreter holds exactly the wanted releases (local tags like +cpu ignored)."""
    def release(value: str | None) -> str | None:
        return value.split("+", 1)[0] if value else None

    plugins = ("accelerate", "pytest", "pytest-rerunfailures", "pytest-timeout")
    return (release(versions.get("torch")) == spec.torch
            and release(versions.get("transformers")) == spec.transformers
            and all(versions.get(name) for name in plugins))


def holds_installs(python: Path | str, spec: EnvSpec) -> bool:
    """Whether an interpreter already has every `install:` entry: a local project by its name (from its
    pyproject.toml), a requirement by name and version. Anything it cannot tell means no."""
    wanted = [_installed_as(entry) for entry in spec.install]
    if not wanted:
        return True
    if None in wanted:
        return False
    done = subprocess.run([str(python), "-c", HOLDS_SCRIPT, json.dumps(wanted)],
                          capture_output=True, text=True, timeout=120)
    return done.returncode == 0 and done.stdout.strip() == "yes"


def _installed_as(entry: str) -> tuple[str, str] | None:
    """(distribution name, version specifier) an `install:` entry leaves behind, or None where unknown."""
    from packaging.requirements import InvalidRequirement, Requirement

    tokens = [token for token in shlex.split(entry) if token != "-e"]
    if len(tokens) != 1 or tokens[0].startswith("-"):
        return None
    if tokens[0].startswith("/"):
        if sys.version_info >= (3, 11):
            import tomllib

            try:
                name = tomllib.loads((Path(tokens[0]) / "pyproject.toml").read_text())["project"]["name"]
            except (OSError, ValueError, KeyError, TypeError):
                return None
            return name, ""
        return None  # Python 3.10 has no tomllib: a build is always correct
    try:
        requirement = Requirement(tokens[0])
    except InvalidRequirement:
        return None
    return requirement.name, str(requirement.specifier)


def plan_environment(spec: EnvSpec, root: Path) -> tuple[str, Path, Path | None]:
    """Which interpreter `spec` gets, without building anything: (origin, python, venv folder or None),
    origin being "current" (this interpreter holds the releases and the `install:`), "cached" or "build"."""
    if satisfies(probe_versions(sys.executable), spec) and holds_installs(sys.executable, spec):
        return "current", Path(sys.executable), None
    path = root / env_key(spec)
    return ("cached" if _marker_matches(path, spec) else "build"), path / "bin" / "python", path


def ensure_environment(spec: EnvSpec, root: Path, log: Callable[[str], None]) -> Environment:
    origin, python, path = plan_environment(spec, root)
    with contextlib.ExitStack() as held:
        if origin == "cached" and path is not None:
            changed = manifest_difference(path)
            if changed:
                log(f"environment {path.name} changed since it was built ({changed}); rebuilding it")
                origin = "build"
        if origin == "build":
            assert path is not None  # plan_environment names a folder for every origin but "current"
            # Runners on one host share the cache: one run builds, the others wait, then find it cached.
            held.enter_context(build_lock(path, log))
            origin, python, path = plan_environment(spec, root)
            if origin == "cached" and path is not None and manifest_difference(path):
                origin = "build"
        if origin == "build":
            assert path is not None  # as above
            build(spec, path, log)
            origin = "built"
        return _checked(spec, origin, python, path)


def write_manifest(path: Path) -> None:
    """Record every file of a freshly built environment; the marker and manifest are left out."""
    (path / MANIFEST).write_text(json.dumps(_fingerprint(path), indent=0, sort_keys=True))


def manifest_difference(path: Path) -> str | None:
    """What differs between an environment and its manifest (None: nothing), e.g. `added lib/.../x.pth`."""
    try:
        recorded = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return "no readable manifest"
    if not isinstance(recorded, dict):
        return "no readable manifest"
    current = _fingerprint(path)
    for name in sorted(current.keys() - recorded.keys()):
        return f"added {name}"
    for name in sorted(recorded.keys() - current.keys()):
        return f"removed {name}"
    for name in sorted(current):
        if current[name] != recorded[name]:
            return f"changed {name}"
    return None


def _fingerprint(path: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for folder, folders, files in os.walk(path):
        for name in files + [entry for entry in folders if os.path.islink(os.path.join(folder, entry))]:
            full = os.path.join(folder, name)
            relative = os.path.relpath(full, path)
            if relative in _NOT_FINGERPRINTED:
                continue
            if os.path.islink(full):
                found[relative] = "link:" + os.readlink(full)
            else:
                found[relative] = "sha256:" + _sha256(full)
    return found


def _sha256(file: str) -> str:
    digest = hashlib.sha256()
    try:
        with open(file, "rb") as stream:
            while chunk := stream.read(_HASH_CHUNK):
                digest.update(chunk)
    except OSError as error:  # a socket, or a file nobody may read: never what a build wrote
        return f"unreadable ({error.strerror or error})"
    return digest.hexdigest()


def _checked(spec: EnvSpec, origin: str, python: Path, path: Path | None) -> Environment:
    versions = probe_versions(python)
    if origin == "built":
        assert path is not None  # what was built has a folder
        if not satisfies(versions, spec):
            raise EnvironmentBuildError(
                f"{path}: built, but holds torch {versions.get('torch')} and transformers "
                f"{versions.get('transformers')} instead of {spec.torch} and {spec.transformers}")
        markers.finish(path, markers.CELL, {"requirements": requirements(spec), "versions": versions})
        write_manifest(path)  # after the probe: nothing runs in it between the build and the manifest
    return Environment(python=python, origin=origin, path=path, versions=versions)


@contextlib.contextmanager
def build_lock(path: Path, log: Callable[[str], None]) -> Iterator[None]:
    """Hold `<env>.lock` exclusively; the kernel lets go if this process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        lock = markers.open_lock(path, create=True)
    except OSError as error:  # a link or a FIFO where the lock goes: nothing harness made
        raise EnvironmentBuildError(f"{markers.lock_path(path)}: cannot lock it: {error.strerror or error}") from None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another harness run that is building environment {path.name}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        os.close(lock)


def start_build(path: Path, kind: str, building: str) -> None:
    """Replace what is at `path` (its lock held) with a new folder holding only the building marker, so
    `harness env clean` can tell it from another tool's folder before any installer writes in it."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)  # a stale or half-built environment; its marker did not match
    markers.begin(path, kind, building)


def build(spec: EnvSpec, path: Path, log: Callable[[str], None]) -> None:
    installer = choose_installer()
    log(f"building environment {path.name} with {installer}: {' '.join(requirements(spec)[:2])}")
    try:
        start_build(path, markers.CELL, " ".join(requirements(spec)))
        python = new_venv(path, installer, log)
        # Compile bytecode once here, or every first import of torch in a fresh cache pays for it.
        install(python, installer, [*index_arguments(installer), *requirements(spec)], log, compile_bytecode=True)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)  # a failed build is 1 GB that nothing will ever use
        raise


def new_venv(path: Path, installer: str, log: Callable[[str], None]) -> Path:
    """A virtual environment for this interpreter at `path` (new, or holding only what start_build wrote);
    its python."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if installer == "uv":
        # --allow-existing keeps the building marker; uv refuses a folder that is not empty without it.
        run_logged([_uv_or_fail(), "venv", "--quiet", "--allow-existing", "--python", sys.executable, str(path)], log)
    else:
        run_logged([sys.executable, "-m", "venv", str(path)], log)
    return path / "bin" / "python"


def install(python: Path, installer: str, arguments: list[str], log: Callable[[str], None], *,
            compile_bytecode: bool = False) -> None:
    """Install into the environment of `python`. uv copies files out of its cache (--link-mode=copy): a hard
    link would make the installed file and the cache's one the same file, so editing one in place (a run's
    code can) would edit what every later install from that cache gets."""
    if installer == "uv":
        command = [_uv_or_fail(), "pip", "install", "--link-mode=copy", "--python", str(python)]
        command += ["--compile-bytecode"] if compile_bytecode else []
    else:
        command = [str(python), "-m", "pip", "install", "--progress-bar", "off"]
    run_logged(command + arguments, log)


def choose_installer() -> str:
    chosen = os.environ.get(INSTALLER_ENV, "").strip()
    if chosen and chosen not in ("uv", "pip"):
        raise EnvironmentBuildError(f"{INSTALLER_ENV}={chosen!r}: expected uv or pip")
    if chosen:
        return chosen
    return "uv" if _uv() else "pip"


def _marker_matches(path: Path, spec: EnvSpec) -> bool:
    mark = markers.read(path)
    return (mark is not None and mark.complete and mark.kind == markers.CELL
            and mark.data.get("requirements") == requirements(spec) and (path / "bin" / "python").exists())


def _uv() -> str | None:
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.exists() else shutil.which("uv")


def _uv_or_fail() -> str:
    found = _uv()
    if found is None:
        raise EnvironmentBuildError(f"{INSTALLER_ENV}=uv, but no uv beside this python nor on PATH")
    return found


def run_logged(command: list[str], log: Callable[[str], None]) -> None:
    lines: list[str] = []
    try:
        # Through the tether: the installer dies with harness however harness dies, and it takes SIGTERM and SIGINT
        # as usual (harness run blocks both to learn their sender; a child inherits the blocked mask). Untethered, it
        # ignored stop()'s SIGTERM and an interrupted install waited out the grace.
        process = subprocess.Popen(tethered(command, signal.SIGKILL), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
    except OSError as error:
        raise EnvironmentBuildError(f"{command[0]}: {error.strerror}") from None
    assert process.stdout is not None
    try:
        for line in process.stdout:
            lines.append(line.rstrip())
            log(line.rstrip())
    except BaseException:  # interrupted (SIGTERM, Ctrl-C) or failing: the installer must not outlive harness
        stop(process)
        raise
    if process.wait() != 0:
        raise EnvironmentBuildError(f"{Path(command[0]).name} exited {process.returncode}: "
                                    f"{_tail(chr(10).join(lines))}")


def stop(process: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`: the installer gone before harness goes on."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _tail(text: str) -> str:
    """The installer's own words: from its last line that says error (with its causes), else the last lines."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.lower().startswith("error")]
    chosen = lines[starts[-1]: starts[-1] + 4] if starts else lines[-3:]
    return " ".join(chosen)[:600] or "no output"
