"""Which folders of an environment cache are harness's own: the markers its builds write, and their locks.

A build holds `<folder>.lock`, creates the folder and writes BUILDING in it before any installer runs
(what is being built, its kind, which harness, where); when the build is done it writes its kind's
complete marker and removes BUILDING. So every folder a build of harness leaves carries one of them, and
a folder with neither was not made here, whatever its name. Kinds: a cell's environment (CELL) and a
`bisect --repo` commit environment (BISECT_COMMIT), each with its own complete marker file.

Markers and locks are opened without following a symbolic link and only when they are regular files: a
link in a cache (planted, or a copy gone wrong) never lends a folder an owner, nor makes harness write
or lock a file elsewhere.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness import __version__

CELL = "cell"
BISECT_COMMIT = "bisect-commit"
BUILDING = "harness-building.json"
COMPLETE = {CELL: "harness-env.json", BISECT_COMMIT: "harness-commit-env.json"}
_MARKER_BYTES = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Mark:
    """What a folder's marker says: its kind, whether its build finished, and the marker's content."""

    kind: str
    complete: bool
    data: dict
    mtime: float  # the marker's: a complete one is touched at each use


def lock_path(folder: Path) -> Path:
    return folder.with_name(folder.name + ".lock")


def begin(folder: Path, kind: str, building: str) -> None:
    """Create `folder` (the caller holds its lock and removed what was there) with only BUILDING in it."""
    folder.mkdir(parents=True)
    record = {"kind": kind, "building": building, "harness": __version__, "host": socket.gethostname(),
              "pid": os.getpid(), "started": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    _write_new(folder / BUILDING, record)


def finish(folder: Path, kind: str, data: dict) -> None:
    """The build is done: its complete marker (with `kind`), then BUILDING goes."""
    (folder / COMPLETE[kind]).write_text(json.dumps({**data, "kind": kind}, indent=2))
    (folder / BUILDING).unlink(missing_ok=True)


def read(folder: Path) -> Mark | None:
    """The folder's mark, or None when it has none harness wrote: it is not harness's."""
    for kind, name in COMPLETE.items():
        found = _read_regular(folder / name)
        if found is not None:
            return Mark(kind=kind, complete=True, data=found[0], mtime=found[1])
    found = _read_regular(folder / BUILDING)
    if found is None or found[0].get("kind") not in COMPLETE:
        return None
    return Mark(kind=found[0]["kind"], complete=False, data=found[0], mtime=found[1])


def touch(folder: Path) -> None:
    """Record a use now on the folder's complete marker (never through a link)."""
    for name in COMPLETE.values():
        with contextlib.suppress(OSError):
            os.utime(folder / name, follow_symlinks=False)
            return


def open_lock(folder: Path, *, create: bool) -> int:
    """A descriptor of the folder's lock file; OSError when it is a link, not a regular file, or (without
    `create`) absent."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    descriptor = os.open(lock_path(folder), flags, 0o644)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(f"{lock_path(folder)}: not a regular file")
    return descriptor


@contextlib.contextmanager
def exclusive(folder: Path) -> Iterator[str | None]:
    """Hold the folder's lock without waiting: None while held, else why not (a build holds it, or the lock
    is a link or not a regular file)."""
    try:
        descriptor = open_lock(folder, create=True)
    except OSError:
        yield f"its lock {lock_path(folder).name} is a link or not a regular file"
        return
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield "a build of it is running"
            return
        try:
            yield None
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def being_built(folder: Path) -> bool:
    """Whether a build holds the folder's lock now; never creates a lock file."""
    try:
        descriptor = open_lock(folder, create=False)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)  # closing lets go of a lock this took
    return False


def _write_new(file: Path, record: dict) -> None:
    descriptor = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(json.dumps(record, indent=2))


def _read_regular(file: Path) -> tuple[dict, float] | None:
    """A JSON object from a regular file reached without a link (a FIFO never blocks the open), and its mtime."""
    try:
        descriptor = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            return None
        data = json.loads(os.read(descriptor, _MARKER_BYTES).decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(descriptor)
    return (data, status.st_mtime) if isinstance(data, dict) else None
