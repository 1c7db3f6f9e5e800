"""`harness env list|clean`: what the environment cache holds and what may go.

Reads the cache layout `harness.envs.build` writes: one folder per environment under the cache root, named
by its key (`py3.11-torch2.13.0-tf5.24.0[-<install hash>]`), holding `harness-env.json` (what was
asked and what it holds) once its build finished, and `<key>.lock` beside it while a build runs. A
folder without a readable marker is a failed or half-done build. Last use is the marker's mtime,
touched each time a cell uses the environment (the marker is outside the environment's manifest, so
touching it changes nothing that is checked).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.envs.build import MARKER, EnvSpec, env_key, env_root, holds_installs, probe_versions, satisfies
from harness.errors import ConfigError

DAY_S = 86_400


@dataclass(frozen=True, slots=True, kw_only=True)
class CachedEnvironment:
    path: Path
    size_bytes: int
    complete: bool  # its build finished (a readable marker); else a failed or half-done build
    versions: dict  # python, torch, transformers, ... as built; empty when incomplete
    last_use: float | None  # epoch seconds; None for an incomplete build

    @property
    def name(self) -> str:
        return self.path.name


def mark_used(environment_path: Path | None) -> None:
    """Record that a cell used this environment now (for `env list` and `env clean --unused-days`)."""
    if environment_path is not None:
        with contextlib.suppress(OSError):
            os.utime(environment_path / MARKER)


def scan(root: Path) -> list[CachedEnvironment]:
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.iterdir()):
        if not path.is_dir() or path.is_symlink():
            continue
        versions, last_use = _read_marker(path)
        found.append(CachedEnvironment(path=path, size_bytes=_size(path), complete=versions is not None,
                                       versions=versions or {}, last_use=last_use))
    return found


def _read_marker(path: Path) -> tuple[dict | None, float | None]:
    marker = path / MARKER
    try:
        data = json.loads(marker.read_text(encoding="utf-8")[:1_000_000])
        last_use = marker.stat().st_mtime
    except (OSError, ValueError):
        return None, None
    versions = data.get("versions") if isinstance(data, dict) else None
    return (versions if isinstance(versions, dict) else {}), last_use


def _size(path: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


@contextlib.contextmanager
def not_being_built(path: Path) -> Iterator[bool]:
    """True (holding its lock) when no build of this environment is running; False when one is."""
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def human_size(size_bytes: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.1f} {unit}"
    return f"{size_bytes} B"


def _age(last_use: float | None, now: float) -> str:
    if last_use is None:
        return "failed build"
    days = (now - last_use) / DAY_S
    when = datetime.datetime.fromtimestamp(last_use, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    return f"{when} UTC ({days:.0f} d ago)" if days >= 1 else f"{when} UTC (today)"


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
    environments = scan(root)
    if not environments:
        print(f"no environments in {root}")
        return 0
    now = time.time()
    print(f"{len(environments)} environments in {root}, {human_size(sum(e.size_bytes for e in environments))}:")
    for environment in environments:
        versions = environment.versions
        held = (f"torch {versions.get('torch')}, transformers {versions.get('transformers')}, "
                f"python {versions.get('python')}") if environment.complete else "incomplete: no marker"
        print(f"  {environment.name}")
        print(f"    {human_size(environment.size_bytes):>9}  last use {_age(environment.last_use, now)}  {held}")
    return 0


def clean_command(root: Path, *, unused_days: float | None, everything: bool, dry_run: bool) -> int:
    """Failed builds always go; complete environments when unused for `unused_days`, or with `everything`.
    An environment being built (its lock held) is never touched."""
    if unused_days is not None and unused_days < 0:
        raise ConfigError(f"--unused-days {unused_days:g}: expected a number of days >= 0")
    now, freed, removed = time.time(), 0, 0
    for environment in scan(root):
        stale = unused_days is not None and environment.last_use is not None and \
            now - environment.last_use > unused_days * DAY_S
        if environment.complete and not (everything or stale):
            continue
        why = "failed build" if not environment.complete else ("--all" if everything else
                                                               f"unused for more than {unused_days:g} days")
        with not_being_built(environment.path) as free:
            if not free:
                print(f"kept {environment.name}: a build of it is running")
                continue
            if not dry_run:
                shutil.rmtree(environment.path)
        removed, freed = removed + 1, freed + environment.size_bytes
        print(f"{'would remove' if dry_run else 'removed'} {environment.name} ({human_size(environment.size_bytes)}, "
              f"{why})")
    print(f"{'would free' if dry_run else 'freed'} {human_size(freed)} in {removed} environments of {root}")
    return 0


def command(args) -> int:
    root = env_root(args.env_dir)
    if args.env_command == "list":
        return list_command(root)
    return clean_command(root, unused_days=args.unused_days, everything=args.all, dry_run=args.dry_run)
