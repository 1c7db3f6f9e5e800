"""Everything a cell starts on this machine, and its end: nothing outlives the cell, however it forks.

Which process runs this: `harness run` (the local engine) for a cell on this machine, and `harness host` on
each host of a cell across hosts (host 0 around its pytest, every other host around its agent).

    containment = Containment(use_cgroup=cgroup.wanted(os.environ))
    with containment.born_inside():            # the cell's first process starts here
        process = subprocess.Popen(containment.confined(command), env={**environ, **containment.environ})
    containment.spare(process.pid)             # the caller reaps it (Popen reads its exit status)
    ...
    record = containment.end()                 # env.json's "cleanup"

Three layers, each for what the one before cannot cover, all ended in `end()`:

1. The cell's own cgroup where the host offers one (harness.containment.cgroup): frozen, then killed whole. Where
   harness runs as root, the cell starts where that cgroup is the root of every cgroup2 mount it sees
   (harness.containment.confine), so that none of it moves itself out by the mount's path.
2. harness as the child subreaper of the cell's processes (harness.containment.reaper), on every Linux host: it
   ends every descendant that was not there before the cell, one that left the cgroup (a process may write
   itself into another cgroup it can reach; root, into any) included. Where there is no cgroup this is what
   ends the cell.
3. A token in the environment of every process of the cell (harness.containment.cell_token): what carries it dies,
   a process another service started with the cell's environment included.

Each layer stops what it finds before it kills it, and kills through pidfds in rounds (harness.containment.pidkill): a
process that forks and exits over and over is caught stopped, no stranger that inherited a pid is hit, and no
clock gives up while something of the cell still runs. After the last layer every layer's scan looks again: what
one still finds goes through the layers once more, and what is left after _PASSES passes is a survivor.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

from harness.containment import confine, pidkill, reaper
from harness.containment.cell_token import cell_processes
from harness.containment.cgroup import CGROUP_ENV, CellCgroup, CgroupUnavailable
from harness.contract import CLEANUP_CGROUP, CLEANUP_SUBREAPER, CLEANUP_TOKEN, CleanupRecord
from harness.environment import CELL_TOKEN_ENV

REAP_EVERY_S = 0.5  # how often wait() collects the cell's dead orphans
_PASSES = 3  # runs through every layer while the scans after one still find a process of the cell


class Containment:
    """What one cell starts on this machine, from `born_inside` to `end`."""

    def __init__(self, *, use_cgroup: bool = True):
        self.token = uuid.uuid4().hex
        self.environ = {CELL_TOKEN_ENV: self.token}  # for the environment of the cell's first process
        # Not the cell's: never killed (pid and start time: a pid may be reused meanwhile), never reaped here (a
        # child this process had, exited or not, is its owner's to wait for).
        self._before = {pid: pidkill.start_time(pid) for pid in reaper.descendants(os.getpid())}
        self._children_before = reaper.children(os.getpid())
        # Process groups the cell's processes may not be in (a cell process can join only a group of its own
        # session): this process's, and those of what ran below it before the cell
        self._groups_before: set[int | None] = {os.getpgrp(), *(pidkill.process_group(pid) for pid in self._before)}
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
            if self._inside and self.cgroup is not None:  # inside only ever with a cgroup
                with contextlib.suppress(OSError):  # still inside: end() kills member by member, sparing us
                    self.cgroup.leave()
                    self._inside = False

    def confined(self, command: list[str]) -> list[str]:
        """`command`, for the cell's first process (started in born_inside): where the cell has a cgroup, it starts
        where that cgroup is the root of every cgroup2 mount it sees (harness.containment.confine; as root only)."""
        return list(command) if self.cgroup is None else confine.confined(command)

    def spare(self, pid: int) -> None:
        """A child of this process that its caller reaps itself (a Popen): killed with the cell, never reaped here."""
        self._spared.add(pid)

    def wait(self, process: subprocess.Popen, timeout: float | None = None) -> int:
        """`process.wait(timeout)`, collecting the cell's dead orphans meanwhile, as an init does: a process of the
        cell that forks and exits over and over leaves a zombie here at every copy, and unreaped they fill the
        host's pid space (32,768 pids by default) until nothing on the host can fork."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return process.wait(timeout=REAP_EVERY_S if left is None else min(REAP_EVERY_S, left))
            except subprocess.TimeoutExpired:
                if left is not None and left <= REAP_EVERY_S:
                    raise
            if self._subreaper:
                reaper.reap_orphans(self._spared | self._children_before)

    def end(self) -> CleanupRecord:
        """Kill every process of the cell still running, then remove its cgroup; what did it and what survived.
        Once: a later call returns the first call's record."""
        if self._ended is not None:
            return self._ended
        killed: set[int] = set()
        survivors: list[int] = []
        for _ in range(_PASSES):
            killed.update(self._end_once())
            # Only after the last layer's kills does anything count as survived: one layer's kills may end what
            # another's scan found (the rest of a stopped chain), and no scan may miss what still runs.
            scans = ([self.cgroup.pids] if self.cgroup is not None else []) + self._process_scans()
            survivors = sorted({pid for scan in scans for pid in scan() if pidkill.start_time(pid) is not None})
            if not survivors:
                break
        if self.cgroup is not None and not self._inside:
            self.cgroup.remove()
        if self._subreaper:
            reaper.reap_orphans(self._spared | self._children_before)
            reaper.adopt_orphans(False)
        self._ended = CleanupRecord(mechanism=self.mechanism, fallback=self.fallback, killed=len(killed),
                                    survivors=survivors,
                                    cgroup=None if self.cgroup is None else str(self.cgroup.path))
        return self._ended

    def _end_once(self) -> set[int]:
        """Every layer's sweep, in turn; the pids they killed."""
        killed: set[int] = set()
        if self.cgroup is not None:
            cgroup = self.cgroup
            # Frozen, nothing in it forks or moves itself out while it is killed; never while this process is in it.
            frozen = not self._inside and cgroup.freeze()
            whole = cgroup.kill_whole if cgroup.can_kill_whole and not self._inside else None
            killed.update(pidkill.sweep(cgroup.pids, whole, stop_first=not frozen).killed)
        if self._subreaper:
            self._stop_new_groups()
        for scan in self._process_scans():
            killed.update(pidkill.sweep(scan).killed)
        return killed

    def _stop_new_groups(self) -> None:
        """SIGSTOP each process group the cell's processes below this one are in, the dead ones' included. A chain
        that forks and exits faster than a scan reads a state is never seen alive by the scans, but each dead copy,
        unreaped here, names its group, and a signal to the group reaches the live copy even mid-fork; stopped, it
        is found and killed by the sweeps. Such a group holds only the cell's processes: a process joins only a
        group of its own session, and the number cannot be reused while an unreaped member holds it."""
        reaper.reap_orphans(self._spared | self._children_before)  # the older dead: a shorter walk
        groups = {pidkill.process_group(pid) for pid in reaper.below(os.getpid()) - self._children_before
                  if pid not in self._before or pidkill.start_time(pid) != self._before[pid]}
        for group in groups - self._groups_before:
            if group is None:  # gone meanwhile
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGSTOP)

    def _process_scans(self) -> list[Callable[[], Iterable[int]]]:
        """The scans of the layers after the cgroup: the new descendants (where this process is their subreaper),
        then the processes carrying the token."""
        scans: list[Callable[[], Iterable[int]]] = [self._new_descendants] if self._subreaper else []
        return [*scans, lambda: cell_processes(self.token)]

    def _new_descendants(self) -> list[int]:
        # The cell's dead first: a chain of forks leaves a zombie here at every copy, which would slow every scan.
        reaper.reap_orphans(self._spared | self._children_before)
        return [pid for pid in reaper.descendants(os.getpid())
                if pid not in self._before or pidkill.start_time(pid) != self._before[pid]]

    def _give_up_cgroup(self, why: str) -> None:
        if self.cgroup is not None:
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
