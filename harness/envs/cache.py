"""`harness env list|clean`: what the environment cache holds and what may go.

Reads the cache layout the builds write: one folder per environment under the cache root, named by its
key (`py3.11-torch2.13.0-tf5.24.0[-<install hash>]`, a `bisect --repo` commit environment adds
`-<package>@<commit>`), and `<key>.lock` beside it. A folder is harness's only when it carries a
marker harness wrote (harness.envs.markers): a complete one once its build finished, else the building
marker its build wrote first. Anything else in the root is another tool's, whatever its name: `clean`
refuses such a root whole, so pointed at `~/.cache` it removes nothing. Commit environments are
`bisect`'s, kept unless asked. Last use is the complete marker's mtime, touched each time a cell uses
the environment (markers are outside the environment's manifest, so touching one changes nothing checked).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.envs import markers
from harness.envs.build import EnvSpec, env_key, env_root, holds_installs, probe_versions, satisfies
from harness.errors import ConfigError

DAY_S = 86_400
_NAMED = 5  # foreign entries a refusal names


@dataclass(frozen=True, slots=True, kw_only=True)
class CachedEnvironment:
    path: Path
    size_bytes: int
    mark: markers.Mark | None  # None: no marker yet, and a build holds its lock (it writes one next)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def kind(self) -> str | None:
        return self.mark.kind if self.mark else None

    @property
    def complete(self) -> bool:
        return self.mark is not None and self.mark.complete

    @property
    def last_use(self) -> float | None:
        return self.mark.mtime if self.mark is not None and self.mark.complete else None  # as `complete`


@dataclass(frozen=True, slots=True)
class Survey:
    environments: list[CachedEnvironment]
    foreign: list[str]  # entries harness did not make: folders without a marker, links


def mark_used(environment_path: Path | None) -> None:
    """Record that a cell used this environment now (for `env list` and `env clean --unused-days`)."""
    if environment_path is not None:
        markers.touch(environment_path)


def scan(root: Path) -> Survey:
    """Harness's environments under `root`, and what else is there. Links are never followed, and a
    folder without a marker is not looked into (it may be a large cache of another tool)."""
    environments: list[CachedEnvironment] = []
    foreign: list[str] = []
    if not root.is_dir():
        return Survey(environments, foreign)
    for path in sorted(root.iterdir()):
        if path.is_symlink():
            foreign.append(f"{path.name} (a link)")
            continue
        if not path.is_dir():
            continue  # lock files; any other file is never removed and hides nothing
        mark = markers.read(path)
        if mark is None and not markers.being_built(path):
            foreign.append(path.name)
            continue
        environments.append(CachedEnvironment(path=path, size_bytes=_size(path), mark=mark))
    return Survey(environments, foreign)


def _size(path: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def human_size(size_bytes: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.1f} {unit}"
    return f"{size_bytes} B"


def _age(environment: CachedEnvironment, now: float) -> str:
    if environment.last_use is None:
        return "being built" if markers.being_built(environment.path) else "interrupted build"
    days = (now - environment.last_use) / DAY_S
    when = datetime.datetime.fromtimestamp(environment.last_use, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    return f"last use {when} UTC ({days:.0f} d ago)" if days >= 1 else f"last use {when} UTC (today)"


def _holds(environment: CachedEnvironment) -> str:
    mark = environment.mark
    if mark is None:
        return "no marker yet"
    data = mark.data
    if not mark.complete:
        return f"{mark.kind}, incomplete (harness {data.get('harness')}, started {str(data.get('started'))[:16]})"
    if mark.kind == markers.BISECT_COMMIT:
        return f"{mark.kind}: {data.get('package')} {str(data.get('commit'))[:12]}"
    recorded = data.get("versions")
    versions = recorded if isinstance(recorded, dict) else {}
    return (f"{mark.kind}: torch {versions.get('torch')}, transformers {versions.get('transformers')}, "
            f"python {versions.get('python')}")


def build_reason(spec: EnvSpec, root: Path) -> str:
    """Why `harness run` would build a cell's environment: what this interpreter lacks, and what the
    cache has under the environment's key."""
    versions = probe_versions(sys.executable)
    if not satisfies(versions, spec):
        here = (f"this interpreter has torch {versions.get('torch') or 'none'} and transformers "
                f"{versions.get('transformers') or 'none'}, the cell pins {spec.torch} and {spec.transformers}")
    elif not holds_installs(sys.executable, spec):
        here = f"this interpreter lacks the matrix's install: {' '.join(spec.install)} (pip install it here to use it)"
    else:
        here = "this interpreter lacks a pytest plugin the suite needs"
    path = root / env_key(spec)
    cached = "a failed build is in the cache" if path.exists() else "the cache has none"
    return f"{here}; {cached}"


def list_command(root: Path) -> int:
    survey = scan(root)
    environments = survey.environments
    if not environments:
        print(f"no environments in {root}")
    else:
        now = time.time()
        print(f"{len(environments)} environments in {root}, "
              f"{human_size(sum(e.size_bytes for e in environments))}:")
        for environment in environments:
            print(f"  {environment.name}")
            print(f"    {human_size(environment.size_bytes):>9}  {_age(environment, now)}  {_holds(environment)}")
    if survey.foreign:
        print(f"not harness's (no marker; env clean refuses this folder): {_named(survey.foreign)}")
    return 0


def clean_command(root: Path, *, unused_days: float | None, everything: bool, dry_run: bool,
                  include_bisect: bool = False) -> int:
    """Interrupted builds always go; complete environments when unused for `unused_days`, or with
    `everything`; bisect's commit environments only with `include_bisect`. An environment being built (its
    lock held) is never touched; a root holding anything harness did not make is refused whole."""
    if unused_days is not None and unused_days < 0:
        raise ConfigError(f"--unused-days {unused_days:g}: expected a number of days >= 0")
    survey = scan(root)
    if survey.foreign:
        raise ConfigError(f"{root}: not a harness environment cache, nothing removed: no harness marker on "
                          f"{_named(survey.foreign)} (another tool's?)")
    now, freed, removed, kept_bisect, failed = time.time(), 0, 0, 0, 0
    for environment in survey.environments:
        if environment.kind == markers.BISECT_COMMIT and not include_bisect:
            kept_bisect += 1
            continue
        if _why_remove(environment.mark, now, unused_days, everything) is None:
            continue
        with markers.exclusive(environment.path) as busy:
            if busy:
                print(f"kept {environment.name}: {busy}")
                continue
            # Read again under the lock: a build may have finished or begun since the scan.
            why = _why_remove(markers.read(environment.path), now, unused_days, everything)
            if why is None:
                continue
            if not dry_run:
                try:
                    shutil.rmtree(environment.path)  # refuses a link; never follows one inside
                except OSError as error:
                    failed += 1
                    print(f"could not remove {environment.name}: {error}")
                    continue
        removed, freed = removed + 1, freed + environment.size_bytes
        print(f"{'would remove' if dry_run else 'removed'} {environment.name} ({human_size(environment.size_bytes)}, "
              f"{why})")
    print(f"{'would free' if dry_run else 'freed'} {human_size(freed)} in {removed} environments of {root}")
    if kept_bisect:
        print(f"kept {kept_bisect} bisect commit environments (--include-bisect removes them too)")
    return 1 if failed else 0


def _why_remove(mark: markers.Mark | None, now: float, unused_days: float | None, everything: bool) -> str | None:
    if mark is None:
        return None  # not harness's (any more)
    if not mark.complete:
        return "interrupted build"
    if everything:
        return "--all"
    if unused_days is not None and now - mark.mtime > unused_days * DAY_S:
        return f"unused for more than {unused_days:g} days"
    return None


def _named(entries: list[str]) -> str:
    more = len(entries) - _NAMED
    return ", ".join(entries[:_NAMED]) + (f" and {more} more" if more > 0 else "")


def command(args) -> int:
    root = env_root(args.env_dir)
    if args.env_command == "list":
        return list_command(root)
    return clean_command(root, unused_days=args.unused_days, everything=args.all, dry_run=args.dry_run,
                         include_bisect=args.include_bisect)
