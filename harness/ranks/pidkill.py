"""Killing the processes a scan found, in rounds, without ever hitting a stranger.

A scan (a cgroup's member list, the process tree below harness, the processes carrying a cell's token) names
pids; by the time a signal goes, a pid may have exited and been handed to an unrelated process. So each pid
is opened as a pidfd (Linux 5.3+), which pins one process, and that process is checked to be the one the scan
saw (the same start time) before it is signalled through the pidfd. Where pidfds are missing the same check
comes before `os.kill`, which leaves only the moment between the two.

Rounds, not a clock: each round kills what its scan finds and waits for those to exit; the sweep ends when a
scan finds nothing, and gives up only after MAX_ROUNDS rounds that each found something to kill (a process
the kernel will not let die, or one that forks faster than the scans). Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

MAX_ROUNDS = 50
# How long a round waits for the processes it signalled to exit: SIGKILL is at once, but a process holding a
# GPU can take seconds to be torn down. A round that waits in vain just leads to the next round.
ROUND_EXIT_WAIT_S = 2.0
_POLL_S = 0.02  # without pidfds: how often a round looks whether its processes have exited


@dataclasses.dataclass(frozen=True)
class Swept:
    killed: tuple[int, ...]  # every pid signalled
    survivors: tuple[int, ...]  # found alive by a scan after the last round


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat field 22); None where it is gone or a zombie.
    A pid and its start time name one process: a reused pid starts later."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def sweep(scan: Callable[[], Iterable[int]], kill_all: Callable[[], None] | None = None) -> Swept:
    """Kill every process `scan` names, round after round, until a scan names none. `kill_all`: one call that
    kills every process the scan can name (a cgroup's cgroup.kill) in place of a signal per process."""
    killed: set[int] = set()
    for _ in range(MAX_ROUNDS):
        seen = {pid: started for pid in scan() if (started := start_time(pid)) is not None}
        if not seen:
            return Swept(tuple(sorted(killed)), ())
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
    left = sorted(pid for pid in scan() if start_time(pid) is not None)
    return Swept(tuple(sorted(killed)), tuple(left))


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


def _kill(pid: int, pidfd: int | None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


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
