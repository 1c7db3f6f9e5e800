"""Folders harness makes at a name another local user may have taken first (the system's temporary folder, a
path from the environment): made and opened without following a link, then checked and changed through the open
descriptor alone, never by name again, so a link or a folder planted at that name is refused in one line instead
of making harness chmod, or write in, whatever it points at. Create files in them relative to the descriptor
(`os.open(name, ..., dir_fd=descriptor)`) with O_NOFOLLOW.

Two kinds: a private folder (0700, this user's) and a shared one (1777: every user may create files in it, the
sticky bit keeps each from removing another's). Standard library.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from harness.errors import ConfigError

PRIVATE_MODE = 0o700
SHARED_MODE = 0o1777
_OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def private(path: Path, purpose: str) -> Iterator[int]:
    """A descriptor of `path`, this user's folder, 0700 (made so when absent or more open). ConfigError (one line
    naming `path` as `purpose`): a link, not a folder, or another user's folder."""
    descriptor = _open(path, PRIVATE_MODE, purpose)
    try:
        status = os.fstat(descriptor)
        if status.st_uid != os.geteuid():
            raise ConfigError(_refusal(path, purpose, f"it belongs to uid {status.st_uid}, not to this user "
                                                      f"({os.geteuid()})"))
        if stat.S_IMODE(status.st_mode) != PRIVATE_MODE:
            os.fchmod(descriptor, PRIVATE_MODE)
        yield descriptor
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def shared(path: Path, purpose: str) -> Iterator[int]:
    """A descriptor of `path`, a folder all local users create files in: this user's (made 1777 when absent or
    otherwise), or root's with the sticky bit (as /tmp is). ConfigError (one line naming `path` as `purpose`): a
    link, not a folder, or a folder of another user, who could remove or swap any file in it."""
    descriptor = _open(path, SHARED_MODE, purpose)
    try:
        status = os.fstat(descriptor)
        if status.st_uid == os.geteuid():
            if stat.S_IMODE(status.st_mode) != SHARED_MODE:
                os.fchmod(descriptor, SHARED_MODE)  # the descriptor's folder: never what a link points at
        elif status.st_uid != 0 or not status.st_mode & stat.S_ISVTX:
            raise ConfigError(_refusal(path, purpose, f"it belongs to uid {status.st_uid}, neither this user "
                                                      f"({os.geteuid()}) nor root with the sticky bit"))
        yield descriptor
    finally:
        os.close(descriptor)


def _open(path: Path, mode: int, purpose: str) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)  # the umask may narrow it: the callers set the mode through the descriptor
    try:
        return os.open(path, _OPEN_FOLDER)
    except OSError as error:
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(path).st_mode):
                raise ConfigError(_refusal(path, purpose, f"it is a symbolic link (to {os.readlink(path)})")) from None
        raise ConfigError(_refusal(path, purpose, error.strerror or str(error))) from None


def _refusal(path: Path, purpose: str, reason: str) -> str:
    return f"{path}: refused as {purpose}: {reason}"
