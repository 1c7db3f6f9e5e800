"""Run a command until it finishes or stops making progress, never against a fixed clock.

A busy machine makes every step slow, but a step that is only slow still moves: it prints, or some
process of its session burns CPU, starts or ends. A step is called stuck only when none of that has
happened for `stall_seconds`; then its whole session is killed. This is what the workflow-run tests
use instead of a wall-clock timeout, so load alone can never fail them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")


def session_activity(session_id: int) -> frozenset[tuple[int, int]]:
    """(pid, CPU ticks) of every live process of a session: any change between two samples is progress."""
    found = set()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended between listing and reading
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is fields[0]
        if int(fields[3]) == session_id:  # sid
            utime, stime = int(fields[11]), int(fields[12])
            found.add((int(entry.name), utime + stime))
    return frozenset(found)


class Stalled(Exception):
    def __init__(self, command: list[str], stall_seconds: float, output: str) -> None:
        super().__init__(f"{command[0]}: no output and no CPU use for {stall_seconds:.0f} s; killed its session")
        self.output = output


def run_while_progressing(
    command: list[str], *, stall_seconds: float, poll_seconds: float = 1.0,
    activity: Callable[[int], frozenset] = session_activity, **popen: object,
) -> subprocess.CompletedProcess[str]:
    """subprocess.run(command, stdout=PIPE, stderr=STDOUT, text=True) that kills the command's session only
    when it has stalled (see the module's docstring); raises `Stalled` with what it printed."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, **popen)
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(process.stdout.readline, "")), daemon=True)
    reader.start()
    last_change, seen = time.monotonic(), (0, activity(process.pid))
    while process.poll() is None:
        time.sleep(poll_seconds)
        now = (len(chunks), activity(process.pid))
        if now != seen:
            last_change, seen = time.monotonic(), now
        elif time.monotonic() - last_change > stall_seconds:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            reader.join()
            raise Stalled(command, stall_seconds, "".join(chunks))
    reader.join()
    _kill_leftovers(process.pid)
    return subprocess.CompletedProcess(command, process.returncode, "".join(chunks), None)


def _kill_leftovers(session_id: int) -> None:
    """What a step left running in the background (a runner kills it at the job's end too)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(session_id, signal.SIGKILL)
