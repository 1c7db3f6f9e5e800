"""`harness bisect --repo PATH`: the same search over the commits of a local git checkout of a package.

Each commit is exported (`git archive`, so the checkout is never touched) and built from source into
its own environment: a small virtual environment holding only that build, layered over the cell's
cached environment (a .pth file adds the cell environment's site-packages after its own), so a probe
costs one build of the package, not a new torch. Environments are cached by commit, and like the cell's,
one is used again only while every file in it is the file its build wrote (env.manifest_difference).
They are marked as their own kind (markers.BISECT_COMMIT), which `harness env clean` leaves alone unless
asked; the exported source lives inside the environment's folder while it builds, and goes once installed.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal, overload

from harness.bisect.search import BisectResult, Probe, bisect
from harness.cell.preflight import environment_spec
from harness.envs import build as env
from harness.envs import markers
from harness.errors import ConfigError
from harness.plan.cells import Cell

MARKER = markers.COMPLETE[markers.BISECT_COMMIT]
SOURCE = "harness-source"  # the commit's files, inside the folder being built


@overload
def git(repo: str | Path, *arguments: str, binary: Literal[False] = False) -> str: ...
@overload
def git(repo: str | Path, *arguments: str, binary: Literal[True]) -> bytes: ...
def git(repo: str | Path, *arguments: str, binary: bool = False) -> str | bytes:
    done = subprocess.run(["git", "-C", str(repo), *arguments], capture_output=True, timeout=120, text=not binary)
    if done.returncode != 0:
        error = done.stderr if isinstance(done.stderr, str) else done.stderr.decode(errors="replace")
        raise ConfigError(f"{repo}: git {' '.join(arguments[:2])}: {error.strip().splitlines()[-1] if error else ''}")
    return done.stdout


def resolve(repo: str | Path, ref: str, flag: str) -> str:
    try:
        return str(git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")).strip()
    except ConfigError:
        raise ConfigError(f"{flag} {ref!r}: no such commit in {repo}") from None


def commits_between(repo: str | Path, good: str, bad: str) -> tuple[list[str], str]:
    """The commits from the older ref to the newer along first parents, both included, oldest first,
    and whether that is a regression (good older) or a fix (bad older)."""
    if not (Path(repo) / ".git").exists() and not str(git(repo, "rev-parse", "--git-dir")).strip():
        raise ConfigError(f"--repo {repo}: not a git checkout")
    good_sha, bad_sha = resolve(repo, good, "--good"), resolve(repo, bad, "--bad")
    if good_sha == bad_sha:
        raise ConfigError(f"--good {good} and --bad {bad} are the same commit {good_sha[:12]}")
    if _is_ancestor(repo, good_sha, bad_sha):
        old, new, kind = good_sha, bad_sha, "regression"
    elif _is_ancestor(repo, bad_sha, good_sha):
        old, new, kind = bad_sha, good_sha, "fix"
    else:
        raise ConfigError(f"--good {good} and --bad {bad}: neither is an ancestor of the other")
    listed = str(git(repo, "rev-list", "--reverse", "--first-parent", "--ancestry-path", f"{old}..{new}")).split()
    return [old, *listed], kind


def _is_ancestor(repo: str | Path, older: str, newer: str) -> bool:
    return (
        subprocess.run(
            ["git", "-C", str(repo), "merge-base", "--is-ancestor", older, newer], capture_output=True, timeout=60
        ).returncode
        == 0
    )


def commit_environment(repo: str | Path, sha: str, package: str) -> tuple[Callable, Callable[[Cell, Path], bool]]:
    """(prepare, will_build) for run.run_cell: the cell's environment with `package` built from `sha`."""

    def folder(cell: Cell, root: Path) -> Path:
        return root / f"{env.env_key(environment_spec(cell))}-{package}@{sha[:12]}"

    def marker_for(base: env.Environment) -> dict:
        return {"base": str(base.python), "package": package, "commit": sha, "kind": markers.BISECT_COMMIT}

    def ready(path: Path, marker: dict) -> bool:
        """Built for this commit over this base, and every file still the one its build wrote."""
        recorded = markers.read(path)
        return (recorded is not None and recorded.complete and recorded.data == marker
                and (path / "bin" / "python").exists() and env.manifest_difference(path) is None)

    def prepare(cell: Cell, root: Path, log: Callable[[str], None]) -> env.Environment:
        base = env.ensure_environment(environment_spec(cell), root, log)
        path = folder(cell, root)
        marker = marker_for(base)
        origin = "cached"
        if not ready(path, marker):
            with env.build_lock(path, log):
                if not ready(path, marker):
                    log(f"building environment {path.name} from {package} {sha[:12]} over {base.python}")
                    env.start_build(path, markers.BISECT_COMMIT, f"{package}@{sha} over {base.python}")
                    build(repo, sha, base, path, log)
                    markers.finish(path, markers.BISECT_COMMIT, marker)
                    env.write_manifest(path)  # what later uses check before they run anything in it
                    origin = "built"
        python = path / "bin" / "python"
        return env.Environment(python=python, origin=origin, path=path, versions=env.probe_versions(python))

    def will_build(cell: Cell, root: Path) -> bool:
        try:
            origin, python, _ = env.plan_environment(environment_spec(cell), root)
        except env.EnvironmentBuildError:
            return True
        base = env.Environment(python=python, origin=origin, path=None, versions={})
        return not ready(folder(cell, root), marker_for(base))

    return prepare, will_build


def build(repo: str | Path, sha: str, base: env.Environment, path: Path, log: Callable[[str], None]) -> None:
    """Into `path` (new, holding only its building marker): `sha`'s package over the cell environment."""
    source = path / SOURCE
    source.mkdir()
    archive = git(repo, "archive", "--format=tar", sha, binary=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        # git archive of our own checkout; the data filter where this Python has it (3.10.12+, 3.11.4+).
        if hasattr(tarfile, "data_filter"):
            tar.extractall(source, filter="data")
        else:
            tar.extractall(source)
    installer = env.choose_installer()
    python = env.new_venv(path, installer, log)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    own = Path(subprocess.run([str(python), "-c", purelib], capture_output=True, text=True, check=True).stdout.strip())
    under = subprocess.run([str(base.python), "-c", purelib], capture_output=True, text=True, check=True).stdout
    # addsitedir (not a bare path) so the cell environment's own .pth files still apply.
    (own / "_harness_cell_environment.pth").write_text(f"import site; site.addsitedir({under.strip()!r})\n")
    # --no-deps: everything else comes from the cell's environment; no isolation: build with its setuptools.
    env.install(python, installer, ["--no-deps", "--no-build-isolation", str(source)], log)
    shutil.rmtree(source)  # installed: the environment no longer reads it


def bisect_commits(
    cell: Cell,
    prober,
    package: str,
    repo: str,
    good: str,
    bad: str,
    *,
    shape: str,
    emit: Callable[[Probe], None] | None = None,
) -> BisectResult:
    emit = emit or (lambda probe: print(probe.line(), flush=True))
    commits, kind = commits_between(repo, good, bad)
    short = [sha[:12] for sha in commits]
    subjects = dict(
        zip(short, str(git(repo, "log", "--format=%s", "--no-walk=unsorted", *commits)).splitlines(), strict=False)
    )
    print(
        f"bisect {package} over {len(commits)} commits {short[0]}..{short[-1]} of {repo} on {shape} "
        f"(torch {cell.torch}, transformers {cell.transformers} under it)",
        flush=True,
    )

    def probe(version: str) -> Probe:
        sha = commits[short.index(version)]
        prepare, will_build = commit_environment(repo, sha, package)
        label = f"{package} {version} {subjects.get(version, '')[:40]}".rstrip()
        result = prober(
            {package: version}, label, prepare=prepare, pins={}, built=lambda c: will_build(c, prober.env_dir)
        )
        emit(result)
        return result

    ends = {"regression": (short[0], short[-1]), "fix": (short[-1], short[0])}[kind]
    return bisect(package, short, good=ends[0], bad=ends[1], probe=probe)
