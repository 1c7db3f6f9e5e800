"""Whose a signal to harness is: the code under test's, or from outside the cell (the runner, a person, the kernel).

The kernel names a signal's sender (its pid, `si_pid`); this reads the sender's ancestry from /proc. A process
that descends from harness is the cell's (its pytest, its ranks, anything they started): harness is the child
subreaper of what a cell starts (harness.containment.reaper), so a process that double-forks away from its parent is
reparented to harness and still descends from it. The walk reads the kernel's parent links, which no process can
forge (its environment and its command line it can).

A sender may be gone before harness looks: an exited process lingers as a zombie (its parent link still readable)
only until its parent reaps it, and a `kill` command exits at once. Such a sender is `UNKNOWN`; the caller decides
(harness.engines.interruption says how and why). Standard library only; Linux.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

PROC = Path("/proc")
COMMAND_CHARS = 160  # of the sender's command line, for env.json's words: enough to recognize it
_HOPS = 4096  # more parent links than a process tree has: a bound on a walk that pid reuse could send round


class Whose(enum.Enum):
    CELL = "a process of the cell"  # descends from harness
    OUTSIDE = "from outside the cell"  # the kernel or a terminal (pid 0), harness itself, its parent, any other
    UNKNOWN = "gone before harness could tell whose it was"


@dataclasses.dataclass(frozen=True)
class Sender:
    pid: int  # 0: the kernel (a terminal's Ctrl-C), or a process outside harness's pid namespace
    whose: Whose
    command: str  # its command line as /proc had it; "" where it could not be read

    def describe(self) -> str:
        if self.pid == 0:
            return "the kernel (a terminal's Ctrl-C, or a sender outside this pid namespace)"
        named = f"pid {self.pid} ({self.command})" if self.command else f"pid {self.pid}"
        return f"{named}, {self.whose.value}"


def available(proc: Path = PROC) -> bool:
    """Whether parent links can be read here (Linux with /proc mounted)."""
    return (proc / "self" / "stat").is_file()


def identify(pid: int, *, me: int, parent: int, proc: Path = PROC) -> Sender:
    """Whose a signal from `pid` is, for harness running as `me` and started by `parent`."""
    if pid == 0 or pid == me:
        return Sender(pid, Whose.OUTSIDE, "")
    command = _command(pid, proc)
    for _ in range(3):  # an ancestor that exits mid-walk reparents the rest: walk again from the sender
        ancestry = _descends(pid, me, proc)
        if ancestry is not None:
            return Sender(pid, Whose.CELL if ancestry else Whose.OUTSIDE, command)
    # The process that started harness, signalling as it ends (its parent-death signal to a pack's member run):
    # it cannot be the cell's, which starts below harness.
    return Sender(pid, Whose.OUTSIDE if pid == parent else Whose.UNKNOWN, command)


def _descends(pid: int, ancestor: int, proc: Path) -> bool | None:
    """Whether `pid` descends from `ancestor`; None where a link could not be read (a process gone)."""
    current = pid
    for _ in range(_HOPS):
        parent = _parent(current, proc)
        if parent is None:
            return None
        if parent == ancestor:
            return True
        if parent == 0:  # above the pid namespace's init (or a process entered from outside it)
            return False
        current = parent
    return False


def _parent(pid: int, proc: Path) -> int | None:
    try:  # the name in parentheses may hold spaces and ")": the fields after the last ")" are fixed
        return int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _command(pid: int, proc: Path) -> str:
    """Its command line (a zombie's is empty: then its name), printable and bounded: the sender chose it."""
    try:
        text = (proc / str(pid) / "cmdline").read_bytes()[:4 * COMMAND_CHARS].replace(b"\0", b" ").strip()
        if not text:
            stat = (proc / str(pid) / "stat").read_text()
            text = stat[stat.index("(") + 1:stat.rindex(")")].encode()
    except (OSError, ValueError):
        return ""
    words = "".join(ch if ch.isprintable() else "?" for ch in text.decode(errors="replace"))
    return words if len(words) <= COMMAND_CHARS else words[:COMMAND_CHARS - 3] + "..."
