"""progress_watch: a step is killed when it stalls, never because the machine is slow."""

from __future__ import annotations

import subprocess
import sys

import pytest
from progress_watch import Stalled, run_while_progressing, session_activity


def test_a_finished_command_gives_its_output_and_exit_status():
    done = run_while_progressing(["bash", "-c", "echo out; echo err >&2; exit 3"], stall_seconds=3600)
    assert (done.returncode, sorted(done.stdout.split())) == (3, ["err", "out"])


def test_a_command_that_neither_prints_nor_runs_is_killed_as_stalled():
    with pytest.raises(Stalled, match="no output and no CPU use for 0 s; killed its session"):
        run_while_progressing(["bash", "-c", "echo started; sleep 100000"], stall_seconds=0.2, poll_seconds=0.05)


def test_a_command_whose_activity_keeps_changing_is_never_killed():
    """However long it takes: here activity changes on every sample, the command ends by itself."""
    samples = iter(range(10**9))
    done = run_while_progressing(
        [sys.executable, "-c", "import time; time.sleep(1)"], stall_seconds=0.01, poll_seconds=0.02,
        activity=lambda session: frozenset({(session, next(samples))}),
    )
    assert done.returncode == 0


def test_session_activity_sees_a_busy_process_use_cpu():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        first = session_activity(busy.pid)
        assert {pid for pid, _ in first} == {busy.pid}
        while session_activity(busy.pid) == first:  # waits on progress, not on a clock
            pass
    finally:
        busy.kill()
        busy.wait()
