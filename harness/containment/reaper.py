"""The process tree below harness, where no cgroup holds a cell: harness is the child subreaper of what it
starts (`PR_SET_CHILD_SUBREAPER`, Linux 3.4+), so a process of the cell that double-forks away from its
parent is reparented to harness instead of init and stays a descendant, however it hid otherwise (a new
session, a clean environment, another cgroup). Standard library and harness.containment.pidkill only; Linux (elsewhere:
nothing is adopted, and the tree is empty without /proc).

The tree is walked through each process's /proc/PID/task/TID/children, which lists only that process's children:
a walk takes a few reads however many processes the machine runs, so it finds a process that forks and exits
over and over while that process still runs. Where the kernel has no such files, /proc is read whole.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterable

from harness.containment.pidkill import process_state

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


def _children_of(pid: int) -> list[int] | None:
    """The children of `pid`, zombies included (each of its threads lists those it forked); None where the kernel
    keeps no such list (CONFIG_PROC_CHILDREN). Empty where `pid` is gone."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as listing:
                found.extend(int(child) for child in listing.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{thread}"):
                continue  # the thread ended meanwhile
            return None
        except OSError:
            continue
    return found


def _stats() -> Iterable[tuple[int, str, int]]:
    """(pid, state, parent pid) of every process in /proc."""
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"{entry.path}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):  # gone meanwhile
                continue
            yield int(entry.name), fields[0].decode(), int(fields[1])


def _tree(pid: int) -> dict[int, int]:
    """Every process below `pid`, zombies included, with its parent."""
    parents: dict[int, int] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        found = _children_of(parent)
        if found is None:
            return _tree_from_all_of_proc(pid)
        for child in found:
            if child not in parents:
                parents[child] = parent
                frontier.append(child)
    return parents


def _tree_from_all_of_proc(pid: int) -> dict[int, int]:
    children: dict[int, list[int]] = {}
    for child, _, parent in _stats():
        children.setdefault(parent, []).append(child)
    parents: dict[int, int] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child in children.get(parent, []):
            if child not in parents:
                parents[child] = parent
                frontier.append(child)
    return parents


def below(pid: int) -> set[int]:
    """Every process below `pid` in the process tree, zombies included."""
    return set(_tree(pid))


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` in the process tree (from /proc; empty without it)."""
    return {child for child in _tree(pid) if (found := process_state(child)) is not None and found[0] != "Z"}


def children(pid: int) -> set[int]:
    """The processes whose parent is `pid`, zombies included."""
    found = _children_of(pid)
    if found is None:
        return {child for child, _, parent in _stats() if parent == pid}
    return set(found)


def reap_orphans(spare: Iterable[int] = ()) -> None:
    """Collect the exit status of this process's dead children but `spare` (those a Popen waits for itself, which
    would otherwise read exit status 0): the cell's orphans, reparented here, would stay zombies."""
    keep = set(spare)
    for pid in children(os.getpid()) - keep:
        if (found := process_state(pid)) is not None and found[0] == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
