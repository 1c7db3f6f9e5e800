"""The Python stacks of running ranks, on the host they run on: each rank's faulthandler writes every thread's stack
to its stack file on SIGUSR1 (harness.ranks.rank). One collector for the launcher (its own host's ranks) and a
host's agent (the ranks it forked for a cell across hosts)."""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping
from pathlib import Path

from harness.ranks import lifecycle
from harness.ranks.protocol import STACK_DUMP_GRACE_S
from harness.ranks.rank import stack_path

POLL_S = 0.1


def read_stack(workdir: str | Path, rank: int) -> str:
    """What the rank's faulthandler wrote ("" for nothing yet)."""
    try:
        return stack_path(workdir, rank).read_text(errors="replace")
    except FileNotFoundError:
        return ""


def collect(workdir: str | Path, pids: Mapping[int, int], *, clear: bool) -> dict[int, str]:
    """Signal each rank (rank -> pid) and wait until every stack file is written and no longer growing, or the
    grace ends; each rank's stack ("" where none came). `clear`: empty the files first (the agent's, which earlier
    requests wrote; the launcher empties its own before every call)."""
    for rank, pid in pids.items():
        if clear:
            stack_path(workdir, rank).write_text("")
        lifecycle.signal_group(pid, signal.SIGUSR1)
    end = time.monotonic() + STACK_DUMP_GRACE_S
    sizes: dict[int, int] = {}
    while pids and time.monotonic() < end:
        time.sleep(POLL_S)
        now = {rank: len(read_stack(workdir, rank)) for rank in pids}
        if all(now.values()) and now == sizes:  # written, and no longer growing
            break
        sizes = now
    return {rank: read_stack(workdir, rank) for rank in pids}
