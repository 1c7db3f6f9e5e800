"""Nothing outlives the process that launched it.

Three layers, because each misses a case the next one covers:

1. A rank (and the zygote) asks the kernel for SIGKILL when the process that started it dies
   (`PR_SET_PDEATHSIG`, Linux): it works while the rank spins inside C code holding the GIL.
2. A thread in each rank polls the launcher and exits when it is gone (any OS; a forked rank's OS parent
   is the zygote, so this watches the launcher itself).
3. `harness run` marks every process of a cell with a token in its environment (`HARNESS_CELL_TOKEN`,
   inherited by pytest, the zygote, the ranks and whatever they start) and kills every process carrying
   it when the cell ends, however it ends: a rank leads its own process group, so killing pytest's group
   alone misses it.
4. A process can drop the token (a new session and a clean environment) and double-fork away from its
   parent. While a cell runs, `harness run` is a child subreaper (`PR_SET_CHILD_SUBREAPER`, Linux 3.4+):
   an orphan of the cell is reparented to it instead of init, so it stays a descendant, and every
   descendant that was not there before the cell is killed when the cell ends. What escapes all four:
   a process another service starts on the cell's behalf (systemd --user, at, ssh, a container runtime).

Needs only the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

CELL_TOKEN_ENV = "HARNESS_CELL_TOKEN"
ORPHAN_CHECK_INTERVAL_S = 1.0
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


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


# ---------------------------------------------------------------- a cell's processes (harness run)


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
            if marker in environ.split(b"\0") and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def kill_cell_processes(token: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process of the cell (and its group) until none is left; the pids still alive after
    `timeout_s` (none, unless the kernel is stuck on them)."""
    end = time.monotonic() + timeout_s
    while True:
        pids = cell_processes(token)
        if not pids or time.monotonic() > end:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:  # a rank leads a group: what it started goes too
                    os.killpg(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


# ---------------------------------------------------------------- a cell's orphans (harness run, Linux)


def adopt_orphans(enabled: bool) -> bool:
    """Make this process the child subreaper of its descendants (or stop); False where the host cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` in the process tree (from /proc; empty without it)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def kill_new_descendants(before: set[int], timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every descendant of this process that is not in `before` (the cell's, however it hid), reap
    those reparented here, until none is left; the pids still alive after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while True:
        _reap_orphans()
        pids = sorted(descendants(os.getpid()) - before)
        if not pids or time.monotonic() > end:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _reap_orphans() -> None:
    """Collect the exit status of dead children that no Popen owns (orphans reparented to this subreaper)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == os.getpid():
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(entry.name), os.WNOHANG)
