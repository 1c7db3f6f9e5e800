"""One flock per GPU, taken all or nothing before a cell runs on this machine's GPUs, held until it ends: two harness
runs on one host (the cells of a pack included) never share a GPU, whatever NVML's memory shows at the moment
(a neighbour may not have allocated yet). As slime's gpu_lock_exec.py and TensorFlow's parallel_gpu_execute.sh
do it; the kernel drops a lock when its holder dies, so a killed run leaves nothing to clean.

The lock files live in $HARNESS_GPU_LOCK_DIR (default: harness-gpu-locks in the system's temporary folder), one per
GPU UUID; a lock needs only a file that can be opened for reading, so runs of several users exclude each other
where the folder is root's and sticky (made by a run as root, or by the host's administrator). That name is one any
local user can take first: the folder is opened through harness.safedir (a link, or another user's folder, is
refused in one line), and each lock file relative to it, never through a link, and only when it is a plain file
with no other name (never a FIFO to wait on, nor a hard link to a file elsewhere).
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from harness import safedir
from harness.environment import GPU_LOCK_DIR_ENV as LOCK_DIR_ENV
from harness.errors import ConfigError


def lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "harness-gpu-locks")


class GpuLocks:
    """The locks of one cell's GPUs, held until `release`."""

    def __init__(self, descriptors: list[int]):
        self._descriptors = descriptors

    def release(self) -> None:
        for descriptor in self._descriptors:
            os.close(descriptor)  # closing drops the flock
        self._descriptors = []


def try_lock(uuids: Iterable[str]) -> GpuLocks | str:
    """Every GPU's lock, or none: the held locks, or why not (one line naming the GPU another run holds).
    ConfigError (one line) for a lock folder or a lock file that another user could have planted."""
    folder = lock_dir()
    held: list[int] = []
    with safedir.shared(folder, f"the GPU lock folder (${LOCK_DIR_ENV} names another)") as folder_descriptor:
        for uuid in sorted(set(uuids)):  # one order for every run: no two runs wait on each other's half
            name = f"{re.sub(r'[^A-Za-z0-9-]', '_', uuid)}.lock"
            try:
                descriptor = _open_lock_file(folder_descriptor, folder / name)
            except OSError as error:
                GpuLocks(held).release()
                return f"cannot open the lock of GPU {uuid} ({folder / name}): {error.strerror or error}"
            except ConfigError:
                GpuLocks(held).release()
                raise
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(descriptor)
                GpuLocks(held).release()
                return f"GPU {uuid} is held by another harness run on this host (lock {folder / name})"
            held.append(descriptor)
    return GpuLocks(held)


def _open_lock_file(folder_descriptor: int, path: Path) -> int:
    """A descriptor of the lock file `path` (made when absent), opened in the folder's descriptor: never through a
    link, never waiting on a FIFO; a file of any user (their runs lock here too), read only, never written."""
    try:
        descriptor = os.open(path.name, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             0o644, dir_fd=folder_descriptor)
    except OSError:
        if _is_link(folder_descriptor, path.name):  # ELOOP, or EACCES where a kernel checks the sticky folder first
            raise ConfigError(_refusal(path, "a symbolic link")) from None
        raise
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
        os.close(descriptor)
        raise ConfigError(_refusal(path, "not a plain file" if not stat.S_ISREG(status.st_mode)
                                   else f"a file with {status.st_nlink} names (a hard link)"))
    return descriptor


def _is_link(folder_descriptor: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=folder_descriptor).st_mode)
    except OSError:
        return False


def _refusal(path: Path, what: str) -> str:
    return f"{path}: refused as a GPU lock file: {what}, which another user may have planted"
