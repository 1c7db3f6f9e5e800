"""Killing the processes a scan found, in rounds, without ever hitting a stranger, and without one of them forking
away meanwhile.

A scan (a cgroup's member list, the process tree below harness, the processes carrying a cell's token) names
pids; by the time a signal goes, a pid may have exited and been handed to an unrelated process. So each pid
is opened as a pidfd (Linux 5.3+), which pins one process, and that process is checked to be the one the scan
saw (the same start time) before it is signalled through the pidfd. Where pidfds are missing the same check
comes before `os.kill`, which leaves only the moment between the two.

Stop, then kill. A process that forks a child and exits at once, over and over (a fork chain: a few hundred to
a few thousand copies a second), is gone by the time a signal for the pid a scan found arrives, and its newest
copy is one no scan saw. So a round first stops what its scan finds (SIGSTOP: a stopped process neither forks
nor exits, so its pid stays its own), scan after scan, until STEADY_SCANS scans in a row, STEADY_GAP_S apart,
find the same processes and every one of them stopped; only then does each get SIGKILL. A stop that lands after
a copy's fork leaves its child running, which the next scan finds; the chain ends at the first stop that lands
before. Where a frozen cgroup holds the processes (harness.containment.cgroup) nothing can fork, and the stops are left
out. No sweep reports that nothing survived before STEADY_SCANS scans in a row after its last kill found nothing.

Rounds, not a clock: each round kills what its scan finds and waits for those to exit; the sweep ends when the
scans find nothing, and gives up only after MAX_ROUNDS rounds that each found something to kill (a process the
kernel will not let die, or one that forks faster than the scans). Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import time
from collections.abc import Callable, Iterable

MAX_ROUNDS = 50
# How long a round waits for the processes it signalled to exit: SIGKILL is at once, but a process holding a
# GPU can take seconds to be torn down. A round that waits in vain just leads to the next round.
ROUND_EXIT_WAIT_S = 2.0
_POLL_S = 0.02  # without pidfds: how often a round looks whether its processes have exited
# Stopping: scans in a row that must find the same processes, all stopped (or none), and the pause between two.
# A process between its fork and its parent's exit can hide from one scan; it cannot stay hidden that long.
STEADY_SCANS = 3
STEADY_GAP_S = 0.02
# Stop rounds that each found a process not stopped before: a fork chain's next copy each time. The chain ends
# at the first stop that lands before its copy forks, a good share of them; this many in vain is a chain the
# scans cannot outpace, and the kill rounds take over.
MAX_STOP_ROUNDS = 1000
_STOPPED = ("T", "t")  # stopped by a signal, or by a tracer: runs nothing until continued
_GONE = ("Z", "X")  # exited: a zombie waits for its parent to read its exit status


@dataclasses.dataclass(frozen=True)
class Swept:
    killed: tuple[int, ...]  # every pid signalled
    survivors: tuple[int, ...]  # found alive by a scan after the last round


def process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of `pid` from /proc/PID/stat, None where it is gone. The letter: R running, S and
    D waiting, T or t stopped, Z a zombie. The start time (clock ticks since boot, field 22) tells a pid reused
    meanwhile, which starts later."""
    try:
        descriptor = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        text = os.read(descriptor, 4096)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    fields = text.rsplit(b")", 1)[-1].split()
    if len(fields) < 20:
        return None
    return fields[0].decode(), int(fields[19])


def process_group(pid: int) -> int | None:
    """The process group `pid` is in (a zombie's too: its group lives on while it is unreaped); None where gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return None
    return int(fields[2]) if len(fields) > 2 else None


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot); None where it is gone or a zombie. A pid and its start time
    name one process: a reused pid starts later."""
    found = process_state(pid)
    return None if found is None or found[0] in _GONE else found[1]


def sweep(scan: Callable[[], Iterable[int]], kill_all: Callable[[], None] | None = None, *,
          stop_first: bool = True) -> Swept:
    """Kill every process `scan` names, round after round, until the scans name none. `kill_all`: one call that
    kills every process the scan can name (a cgroup's cgroup.kill) in place of a signal per process.
    `stop_first`: stop them all before the kill (False where they are frozen already)."""
    killed: set[int] = set()
    for _ in range(MAX_ROUNDS):
        if stop_first:
            stop(scan)
        seen = _alive(scan())
        if not seen:
            if _stays_empty(scan):
                return Swept(tuple(sorted(killed)), ())
            continue
        handles = _open(seen)
        try:
            if kill_all is not None:
                kill_all()
            else:
                for pid, pidfd in handles.items():
                    _kill(pid, pidfd)
            killed.update(handles)
            _wait_exits(handles)
        finally:
            for pidfd in handles.values():
                if pidfd is not None:
                    os.close(pidfd)
    left = sorted(_alive(scan()))
    return Swept(tuple(sorted(killed)), tuple(left))


def stop(scan: Callable[[], Iterable[int]]) -> None:
    """SIGSTOP every process `scan` names, scan after scan, until STEADY_SCANS scans in a row find the same
    processes, all stopped. Gives up, leaving the rest to the kill, after MAX_STOP_ROUNDS rounds that each found a
    process not signalled before, or after ROUND_EXIT_WAIT_S of rounds that found only processes signalled
    before still running (one in an uninterruptible wait stops when the wait ends)."""
    signalled: set[tuple[int, int]] = set()
    last: frozenset[tuple[int, int]] | None = None
    steady = fresh_rounds = waits = 0
    while fresh_rounds < MAX_STOP_ROUNDS and waits * _POLL_S < ROUND_EXIT_WAIT_S:
        seen: dict[tuple[int, int], str] = {}
        for pid in scan():
            found = process_state(pid)
            if found is not None and found[0] not in _GONE:
                seen[(pid, found[1])] = found[0]
        running = {key for key, letter in seen.items() if letter not in _STOPPED}
        if not running:
            steady = steady + 1 if seen.keys() == last else 1
            last = frozenset(seen)
            if steady >= STEADY_SCANS:
                return
            time.sleep(STEADY_GAP_S)
            continue
        steady, last = 0, None
        for pid, started in running:
            _send(pid, started, signal.SIGSTOP)
        if running <= signalled:  # signalled already, not stopped yet: give them a moment
            waits += 1
            time.sleep(_POLL_S)
        else:
            fresh_rounds += 1
        signalled |= running


def _alive(pids: Iterable[int]) -> dict[int, int]:
    """pid -> start time of each pid that is neither gone nor a zombie."""
    return {pid: started for pid in pids if (started := start_time(pid)) is not None}


def _stays_empty(scan: Callable[[], Iterable[int]]) -> bool:
    """After a scan that found nothing: whether the next STEADY_SCANS - 1, STEADY_GAP_S apart, find nothing too."""
    for _ in range(STEADY_SCANS - 1):
        time.sleep(STEADY_GAP_S)
        if _alive(scan()):
            return False
    return True


def _open(seen: dict[int, int]) -> dict[int, int | None]:
    """pid -> a pidfd on the very process the scan saw (None: no pidfds here); pids gone since are left out."""
    handles: dict[int, int | None] = {}
    for pid, started in seen.items():
        pidfd = _pidfd_open(pid)
        if start_time(pid) != started:  # exited since the scan (and maybe reused): not ours to signal
            if pidfd is not None:
                os.close(pidfd)
            continue
        handles[pid] = pidfd
    return handles


def _pidfd_open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds (not Linux 5.3+), or gone: the start time check decides
        return None


def _send(pid: int, started: int, signum: int) -> None:
    """`signum` to `pid` if it is still the process that started at `started`."""
    handles = _open({pid: started})
    for pidfd in handles.values():
        try:
            _signal(pid, pidfd, signum)
        finally:
            if pidfd is not None:
                os.close(pidfd)


def _kill(pid: int, pidfd: int | None) -> None:
    _signal(pid, pidfd, signal.SIGKILL)


def _signal(pid: int, pidfd: int | None, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(pid, signum)


def _wait_exits(handles: dict[int, int | None]) -> None:
    """Until every process in `handles` has exited, or ROUND_EXIT_WAIT_S: a pidfd polls readable at its exit."""
    end = time.monotonic() + ROUND_EXIT_WAIT_S
    waiting = dict(handles)
    by_pidfd = {pidfd: pid for pid, pidfd in waiting.items() if pidfd is not None}
    poller = select.poll()
    for pidfd in by_pidfd:
        poller.register(pidfd, select.POLLIN)
    while waiting and (left_s := end - time.monotonic()) > 0:
        if by_pidfd:
            for pidfd, _ in poller.poll(left_s * 1000):
                poller.unregister(pidfd)
                waiting.pop(by_pidfd.pop(pidfd), None)
        else:
            time.sleep(_POLL_S)
        waiting = {pid: pidfd for pid, pidfd in waiting.items() if pidfd is not None or start_time(pid) is not None}
