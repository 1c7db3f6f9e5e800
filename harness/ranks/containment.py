"""Everything a cell starts on this machine, and its end: nothing outlives the cell, however it forks.

Which process runs this: `harness run` (the local engine) for a cell on this machine, and `harness host` on
each host of a cell across hosts (host 0 around its pytest, every other host around its agent).

    containment = Containment(use_cgroup=cgroup.wanted(os.environ))
    with containment.born_inside():            # the cell's first process starts here
        process = subprocess.Popen(..., env={**environ, **containment.environ})
    containment.spare(process.pid)             # the caller reaps it (Popen reads its exit status)
    ...
    record = containment.end()                 # env.json's "cleanup"

Three layers, each for what the one before cannot cover, all ended in `end()`:

1. The cell's own cgroup where the host offers one (harness.ranks.cgroup): killed whole.
2. harness as the child subreaper of the cell's processes (harness.ranks.reaper), on every Linux host: it
   kills every descendant that was not there before the cell, one that left the cgroup (a process of the
   cell's user may write itself into another cgroup it can reach) included. Where there is no cgroup this
   is what ends the cell.
3. A token in the environment of every process of the cell (harness.ranks.lifecycle): what carries it dies,
   a process another service started with the cell's environment included.

Each layer kills through pidfds in rounds (harness.ranks.pidkill): no stranger that inherited a pid is hit,
and no clock gives up while something of the cell still runs.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

from harness.contract import CLEANUP_CGROUP, CLEANUP_SUBREAPER, CLEANUP_TOKEN, CleanupRecord
from harness.ranks import pidkill, reaper
from harness.ranks.cgroup import CGROUP_ENV, CellCgroup, CgroupUnavailable
from harness.ranks.lifecycle import CELL_TOKEN_ENV, cell_processes


class Containment:
    """What one cell starts on this machine, from `born_inside` to `end`."""

    def __init__(self, *, use_cgroup: bool = True):
        self.token = uuid.uuid4().hex
        self.environ = {CELL_TOKEN_ENV: self.token}  # for the environment of the cell's first process
        # Not the cell's: never killed (pid and start time: a pid may be reused meanwhile), never reaped here (a
        # child this process had, exited or not, is its owner's to wait for).
        self._before = {pid: pidkill.start_time(pid) for pid in reaper.descendants(os.getpid())}
        self._children_before = reaper.children(os.getpid())
        self._subreaper = reaper.adopt_orphans(True)
        self._spared: set[int] = set()
        self._inside = False  # this process is in the cell's cgroup (in born_inside, or it failed to leave)
        self._ended: CleanupRecord | None = None
        self.cgroup: CellCgroup | None = None
        self.fallback: str | None = f"${CGROUP_ENV}=off"
        if use_cgroup:
            try:
                self.cgroup, self.fallback = CellCgroup.create(), None
            except CgroupUnavailable as why:
                self.fallback = str(why)

    @property
    def mechanism(self) -> str:
        if self.cgroup is not None:
            return CLEANUP_CGROUP
        return CLEANUP_SUBREAPER if self._subreaper else CLEANUP_TOKEN

    @contextlib.contextmanager
    def born_inside(self) -> Iterator[None]:
        """What this process starts in the block is born in the cell's cgroup (where there is one)."""
        if self.cgroup is not None:
            try:
                self.cgroup.enter()
                self._inside = True
            except OSError as error:
                self._give_up_cgroup(f"cannot move a process into {self.cgroup.path}: {error.strerror or error}")
        try:
            yield
        finally:
            if self._inside:
                with contextlib.suppress(OSError):  # still inside: end() kills member by member, sparing us
                    self.cgroup.leave()
                    self._inside = False

    def spare(self, pid: int) -> None:
        """A child of this process that its caller reaps itself (a Popen): killed with the cell, never reaped here."""
        self._spared.add(pid)

    def end(self) -> CleanupRecord:
        """Kill every process of the cell still running, then remove its cgroup; what did it and what survived.
        Once: a later call returns the first call's record."""
        if self._ended is not None:
            return self._ended
        killed: set[int] = set()
        survivors: set[int] = set()
        if self.cgroup is not None:
            cgroup = self.cgroup
            whole = cgroup.kill_whole if cgroup.can_kill_whole and not self._inside else None
            swept = pidkill.sweep(cgroup.pids, whole)
            killed.update(swept.killed)
            survivors.update(swept.survivors)
        if self._subreaper:
            swept = pidkill.sweep(self._new_descendants)
            killed.update(swept.killed)
            survivors.update(swept.survivors)
        swept = pidkill.sweep(lambda: cell_processes(self.token))
        killed.update(swept.killed)
        survivors.update(swept.survivors)
        if self.cgroup is not None and not self._inside:
            self.cgroup.remove()
        if self._subreaper:
            reaper.reap_orphans(self._spared | self._children_before)
            reaper.adopt_orphans(False)
        self._ended = CleanupRecord(mechanism=self.mechanism, fallback=self.fallback, killed=len(killed),
                                    survivors=sorted(survivors),
                                    cgroup=None if self.cgroup is None else str(self.cgroup.path))
        return self._ended

    def _new_descendants(self) -> list[int]:
        return [pid for pid in reaper.descendants(os.getpid())
                if pid not in self._before or pidkill.start_time(pid) != self._before[pid]]

    def _give_up_cgroup(self, why: str) -> None:
        self.cgroup.remove()
        self.cgroup, self.fallback = None, why


def describe(record: CleanupRecord) -> str:
    """One line for a log: what ended the cell's processes, and what it could not end."""
    line = f"the cell's processes ended through: {record.mechanism}"
    if record.fallback:
        line += f" (no cgroup: {record.fallback})"
    if record.killed:
        line += f"; {record.killed} still running at its end, killed"
    if record.survivors:
        line += f"; processes {', '.join(map(str, record.survivors))} survived SIGKILL"
    return line
