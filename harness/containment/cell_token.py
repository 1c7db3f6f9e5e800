"""A cell's token: `HARNESS_CELL_TOKEN` in the environment of the cell's first process, inherited by pytest, the
zygote, the ranks and whatever they start, so a process carrying it is the cell's however it forked or hid (a new
session, another cgroup). The last layer of harness.containment.containment, on any host with /proc; it finds only
this user's processes (another's environment is unreadable), and misses a process another service starts on the
cell's behalf (systemd --user, at, ssh, a container runtime) from an environment without the token.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from harness.containment.pidkill import start_time
from harness.environment import CELL_TOKEN_ENV


def cell_processes(token: str) -> list[int]:
    """The pids of live processes whose environment carries `HARNESS_CELL_TOKEN=token` (own user only)."""
    marker = f"{CELL_TOKEN_ENV}={token}".encode()
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = Path(entry.path, "environ").read_bytes()
            except OSError:  # gone, or another user's
                continue
            # Live: neither gone nor a zombie, as every other scan of harness.containment counts it.
            if marker in environ.split(b"\0") and start_time(int(entry.name)) is not None:
                found.append(int(entry.name))
    return found
