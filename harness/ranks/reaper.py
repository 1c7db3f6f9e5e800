"""The process tree below harness, where no cgroup holds a cell: harness is the child subreaper of what it
starts (`PR_SET_CHILD_SUBREAPER`, Linux 3.4+), so a process of the cell that double-forks away from its
parent is reparented to harness instead of init and stays a descendant, however it hid otherwise (a new
session, a clean environment). Standard library only; Linux (elsewhere: nothing is adopted, and the tree is
empty without /proc).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterable
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans(enabled: bool) -> bool:
    """Make this process the child subreaper of its descendants (or stop); False where the host cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stats() -> Iterable[tuple[int, str, int]]:
    """(pid, state, parent pid) of every process in /proc."""
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):  # gone meanwhile
                continue
            yield int(entry.name), fields[0], int(fields[1])


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` in the process tree (from /proc; empty without it)."""
    children: dict[int, list[int]] = {}
    for child, state, parent in _stats():
        if state != "Z":
            children.setdefault(parent, []).append(child)
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def children(pid: int) -> set[int]:
    """The processes whose parent is `pid`, zombies included."""
    return {child for child, _, parent in _stats() if parent == pid}


def reap_orphans(spare: Iterable[int] = ()) -> None:
    """Collect the exit status of this process's dead children but `spare` (those a Popen waits for itself, which
    would otherwise read exit status 0): the cell's orphans, reparented here, would stay zombies."""
    keep = set(spare)
    for pid, state, parent in list(_stats()):
        if state == "Z" and parent == os.getpid() and pid not in keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
