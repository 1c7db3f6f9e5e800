"""What ranks hand on to the ranks of later tests, on purpose and only as files: each test's ranks are fresh
(harness.ranks.pool), so a result worth reusing (the suite's whole-model runs, which every layout of a family
compares with) goes to a folder of the session instead, under a name made from everything that determines it.

The launcher makes the folder (0700, removed when it closes) and names it in the ranks' `Launch`; in a rank,
`folder()` returns it. None where nothing may be handed on: ranks spawned for one call (`run_distributed`,
`--no-ranks-pool`) and ranks on several hosts (the folder is on host 0). Writes are whole or absent (a
temporary file, then a rename), so a rank killed mid-write leaves nothing half-written behind. Standard library.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

_folder: Path | None = None


def make_folder() -> str:
    """The launcher's side: a new private folder for one session's handovers."""
    return tempfile.mkdtemp(prefix="harness-handover-")  # mkdtemp makes it 0700


def adopt(folder: str | None) -> None:
    """The rank's side, once at its start: the session's folder, or None."""
    global _folder
    _folder = None if folder is None else Path(folder)


def folder() -> Path | None:
    return _folder


def entry_name(key: tuple) -> str:
    """A file name for `key`, a tuple of strings, numbers, booleans and None (their repr is stable)."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:32]


def write_whole(path: Path, data: bytes) -> None:
    """`data` at `path`, or nothing there: never a part of it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".writing-")
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
