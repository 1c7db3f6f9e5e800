"""Nothing outlives the process that launched it, nor the cell that started it.

The layers, because each misses a case the next one covers:

1. A rank (and the zygote) asks the kernel for SIGKILL when the process that started it dies
   (`PR_SET_PDEATHSIG`, Linux): it works while the rank spins inside C code holding the GIL.
2. A thread in each rank polls the launcher and exits when it is gone (any OS; a forked rank's OS parent
   is the zygote, so this watches the launcher itself).
3. A rank leads its own process group, so the launcher kills it and all it started at once.
4. When the cell ends, `harness run` (and `harness host` on each host of a cell across hosts) ends every
   process the cell started, however it forked (harness.containment.containment): the cell's own cgroup where
   the host offers one, else harness as the child subreaper of the cell's processes killing every
   descendant, and on top every process carrying the cell's token (`HARNESS_CELL_TOKEN`, inherited by
   pytest, the zygote, the ranks and whatever they start: harness.containment.cell_token). What escapes
   them all: a process another service starts on the cell's behalf (systemd --user, at, ssh, a container
   runtime) from an environment without the token.

Needs only the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from pathlib import Path

ORPHAN_CHECK_INTERVAL_S = 1.0
_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux; elsewhere the orphan check covers it). The signal
    comes when the parent *thread* that started us exits, so launchers start ranks from the main thread."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != expected_parent:  # the parent died before prctl took effect
        os._exit(3)


def watch_launcher(launcher_pid: int) -> None:
    """Exit this process once `launcher_pid` is gone, checked from a daemon thread."""
    threading.Thread(target=_exit_when_orphaned, args=(launcher_pid,), name="harness-orphan-check",
                     daemon=True).start()


def _exit_when_orphaned(launcher_pid: int) -> None:
    while alive(launcher_pid):
        time.sleep(ORPHAN_CHECK_INTERVAL_S)
    os._exit(3)


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (dead, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return not Path("/proc/self").exists()  # no /proc: trust kill; else it went between the two calls
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def signal_group(pid: int, signum: int) -> None:
    """Signal the process group `pid` leads (a rank and whatever it started); fall back to `pid` alone."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def own_process_group() -> None:
    """Lead a process group, so the launcher can signal this rank and all it started at once; Ctrl-C in a
    terminal then reaches pytest alone, which tears the ranks down."""
    with contextlib.suppress(PermissionError):  # already a group (or session) leader
        os.setpgrp()
