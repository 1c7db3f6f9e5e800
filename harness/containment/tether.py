"""A child tethered to the process that starts it: it gets a signal when that process dies, however it dies.

`harness run` catches SIGINT and SIGTERM and ends its cells itself; SIGKILL (the OOM killer, a runner's last
resort) cannot be caught, and pytest and a pack's member runs start in sessions of their own, so without this
they would run on with nobody to end them. The tether is Linux's parent-death signal (`PR_SET_PDEATHSIG`), set
in a small exec wrapper rather than in `preexec_fn`, which is unsafe once the caller runs threads (the output
relays, NVML's sampler):

    subprocess.Popen(tethered(command, signal.SIGTERM), ...)    # from the thread that lives as long as the child

The signal comes when the *thread* that started the child exits, so only the main thread starts tethered
children. Elsewhere than Linux the command runs as it is. Needs only the standard library.

    python -I harness/containment/tether.py PARENT_PID SIGNUM -- COMMAND...

Run as a file in isolated mode: it needs harness neither importable from the child's folder nor on its path.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def tethered(command: list[str], signum: int) -> list[str]:
    """`command`, receiving `signum` when this process dies."""
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), str(int(signum)), "--", *command]


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: python -I tether.py PARENT_PID SIGNUM -- COMMAND...")
    parent, signum, command = int(argv[0]), int(argv[1]), argv[3:]
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the tether held: what it started must not run
        sys.exit(128 + signum)
    # harness run blocks SIGTERM and SIGINT to learn who sends them (harness.engines.interruption); what it starts
    # takes them as usual.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        os.execvp(command[0], command)  # the death signal survives exec (cleared only for set-uid programs)
    except OSError as error:  # as a shell says it: the caller reads the line, and 127 is "not found"
        print(f"{command[0]}: {error.strerror}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
