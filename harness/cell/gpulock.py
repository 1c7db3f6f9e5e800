"""One flock per GPU, taken all or nothing before a cell runs on this machine's GPUs, held until it ends: two harness
runs on one host (the cells of a pack included) never share a GPU, whatever NVML's memory shows at the moment
(a neighbour may not have allocated yet). As slime's gpu_lock_exec.py and TensorFlow's parallel_gpu_execute.sh
do it; the kernel drops a lock when its holder dies, so a killed run leaves nothing to clean.

The lock files live in $HARNESS_GPU_LOCK_DIR (default: harness-gpu-locks in the system's temporary folder), one per
GPU UUID; a lock needs only a file that can be opened for reading, so runs of several users exclude each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

LOCK_DIR_ENV = "HARNESS_GPU_LOCK_DIR"


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
    """Every GPU's lock, or none: the held locks, or why not (one line naming the GPU another run holds)."""
    folder = lock_dir()
    with contextlib.suppress(OSError):
        folder.mkdir(mode=0o1777, exist_ok=True)
        if folder.stat().st_uid == os.getuid():
            folder.chmod(0o1777)  # other users' runs lock here too (sticky: none removes another's file)
    held: list[int] = []
    for uuid in sorted(set(uuids)):  # one order for every run: no two runs wait on each other's half
        path = folder / f"{re.sub(r'[^A-Za-z0-9-]', '_', uuid)}.lock"
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as error:
            GpuLocks(held).release()
            return f"cannot open the lock of GPU {uuid} ({path}): {error.strerror or error}"
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(descriptor)
            GpuLocks(held).release()
            return f"GPU {uuid} is held by another harness run on this host (lock {path})"
        held.append(descriptor)
    return GpuLocks(held)
