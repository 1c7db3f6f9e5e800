"""SIGTERM and SIGINT to `harness run` (and `harness bisect`): an interruption when they come from outside the cell,
a red of the code under test when they come from it.

Which process runs what: the main thread runs the cells; while `interruptible()` holds, it blocks SIGTERM and SIGINT,
and a thread of its own takes them with `sigtimedwait`, which (unlike a Python signal handler) is told who sent
each one. harness.engines.senders reads whose it is:

- from outside the cell (the runner cancelling the job, a person's Ctrl-C or `kill`, the kernel): the thread wakes
  the main thread with WAKE, whose handler raises `Interrupted` there; the cell stops, its folder says
  `interrupted`, and harness exits 128+signal. Once: later signals wait for the cleanup the first began.
- from a process of the cell (the tested code, its ranks, anything they started): nothing stops. The cell runs on
  to its own end, and the record stage takes the signal (`signals_from_the_cell`) and records the cell errored
  `signalled_harness`, a red of the code under test that triage bisects. The tested code cannot make its own red
  read as a cancelled job.
- from a sender gone before harness could read its ancestry (a `kill` command exits at once): harness stops, as
  for an interruption (a person's `pkill` must still stop harness), but the cell is recorded `signalled_harness`.
  Counted as the tested code's because the two mistakes differ: taken for the cell's, a real cancellation costs
  one bisect that says so in its words; taken for an interruption, a regression that signals harness would read
  as infrastructure and never be bisected, every night it recurred. The senders that cancel jobs (the runner's
  agent, slurmstepd, `timeout`, a shell) outlive their signal; the kernel's and a container runtime's come as pid 0.

Where the sender cannot be seen (no `sigtimedwait` or /proc here, a signal taken by a thread that was running
before the scope began), a signal is an interruption, as Python's handlers report it.

Children inherit the blocked mask: harness.containment.tether unblocks both signals before it execs pytest, a pack's
member run or an installer, so those see them as usual. Short-lived tools started with a timeout (git, sbatch,
kubectl) keep the blocked mask; their timeout ends them with SIGKILL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

from harness import contract
from harness.engines import senders
from harness.engines.senders import Sender, Whose

STOPPING = (signal.SIGTERM, signal.SIGINT)
# Wakes the main thread out of a blocking call to raise an outside interruption there. SIGURG's default action is to
# ignore it, and nearly nothing sends it (Go's runtime preempts its threads with it for the same reason).
WAKE = signal.SIGURG
POLL_S = 0.1  # how often the signal thread looks up from sigtimedwait: the scope's end waits for it at most this
SETTLE_S = 10.0  # how long the record stage waits for the signal thread to take what is already queued
NOTES_KEPT = 16  # signals from the cell kept per cell: a tested code that sends thousands grows nothing


class Interrupted(BaseException):  # a signal, like KeyboardInterrupt: `except Exception` lets it through
    """harness run got SIGTERM or SIGINT from outside the cell: the cell stops, its folder says so, and harness exits
    128+signal. `sender` is who sent it (None: not seen here); one that was gone before harness could tell whose it
    was stops harness too, and the record stage counts it as the cell's."""

    def __init__(self, signum: int, sender: Sender | None = None):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.sender = sender

    @property
    def unattributed(self) -> bool:
        return self.sender is not None and self.sender.whose is Whose.UNKNOWN

    def words(self) -> str:
        """env.json's `error` for a sender that was gone: why the cell is counted a red of the code under test."""
        assert self.sender is not None
        return (f"{self} from {self.sender.describe()}: counted as sent by the tested code "
                f"({contract.ERROR_SIGNALLED_HARNESS})")


@dataclasses.dataclass(frozen=True)
class CellSignal:
    """A SIGTERM or SIGINT a process of the cell sent harness, which stopped nothing."""

    signum: int
    sender: Sender
    at: float  # time.time() as harness took it

    def words(self) -> str:
        return f"the tested code sent harness {signal.Signals(self.signum).name}: {self.sender.describe()}"


class _CellSignals:
    """What the signal thread took from the cell, until the record stage takes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._notes: list[CellSignal] = []

    def add(self, note: CellSignal) -> None:
        with self._lock:
            if len(self._notes) < NOTES_KEPT:
                self._notes.append(note)

    def take(self, since: float) -> list[CellSignal]:
        with self._lock:
            notes, self._notes = self._notes, []
        return [note for note in notes if note.at >= since]


class _Watch:
    """One interruptible scope: the signal thread, and the main thread's handlers."""

    def __init__(self, *, sees_senders: bool) -> None:
        self.me, self.parent = os.getpid(), os.getppid()
        main = threading.main_thread().ident
        assert main is not None  # only a thread not yet started has none
        self.main = main
        self.sees_senders = sees_senders
        self.pending: Interrupted | None = None  # the interruption the main thread is to raise
        self.raised = False  # once: a second signal waits for the cleanup the first began
        self.closing = False
        self._done = threading.Event()
        self._settles: list[threading.Event] = []
        self._settles_lock = threading.Lock()
        self._thread = threading.Thread(target=self._take_signals, name="harness-signals", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.closing = True
        if self._thread.is_alive():
            self._done.set()
            self._thread.join()
        if self.sees_senders:  # queued meanwhile: dropped, as the first interruption's cleanup drops them
            while signal.sigtimedwait(STOPPING, 0) is not None:
                pass

    def settle(self) -> None:
        """Returns once the signal thread has taken every signal queued before the call (or SETTLE_S passed)."""
        if not self._thread.is_alive():
            return
        done = threading.Event()
        with self._settles_lock:
            self._settles.append(done)
        done.wait(SETTLE_S)

    def caught(self, signum: int, frame) -> None:
        """The main thread's handler of SIGTERM and SIGINT: a signal Python's handler saw (no sender)."""
        self._raise(Interrupted(signum))

    def woken(self, signum: int, frame) -> None:
        """The main thread's handler of WAKE: the outside interruption the signal thread took."""
        if self.pending is not None:
            self._raise(self.pending)

    def _raise(self, interrupted: Interrupted) -> None:
        if self.raised or self.closing:
            return
        self.raised = True
        raise interrupted

    def _take_signals(self) -> None:
        while not self._done.is_set():
            info = signal.sigtimedwait(STOPPING, POLL_S)
            if info is not None:
                self._take(info.si_signo, info.si_pid)
                continue
            # Nothing came for POLL_S: whatever was queued before a settle asked is taken.
            with self._settles_lock:
                settles, self._settles = self._settles, []
            for done in settles:
                done.set()

    def _take(self, signum: int, pid: int) -> None:
        try:
            sender = senders.identify(pid, me=self.me, parent=self.parent)
        except Exception:  # a fault of this reading must not swallow a cancel: it stops harness, as an unknown does
            sender = Sender(pid, Whose.UNKNOWN, "")
        if sender.whose is Whose.CELL:
            _from_the_cell.add(CellSignal(signum, sender, time.time()))
            with contextlib.suppress(OSError, ValueError):  # the terminal may be gone
                print(f"\nharness: {signal.Signals(signum).name} from {sender.describe()}: not an interruption; the "
                      f"cell goes on and is recorded {contract.ERROR_SIGNALLED_HARNESS}", file=sys.stderr, flush=True)
            return
        if self.pending is None and not self.closing:
            self.pending = Interrupted(signum, sender)
            signal.pthread_kill(self.main, WAKE)


_from_the_cell = _CellSignals()
_watch: _Watch | None = None  # the scope now open, if any (one at a time: the main thread's)


def signals_from_the_cell(since: float) -> list[CellSignal]:
    """The signals processes of the cell sent harness since `since` (time.time(), the cell's start), first first,
    once each: what was queued when this is called is taken first."""
    if _watch is not None:
        _watch.settle()
    return _from_the_cell.take(since)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM and SIGINT from outside the cell raise `Interrupted` in the main thread (once: a second signal waits
    for the cleanup the first began); from the cell, they are kept for `signals_from_the_cell`."""
    global _watch
    if threading.current_thread() is not threading.main_thread() or _watch is not None:
        yield  # another thread, or a scope already open: the open one decides
        return
    watch = _Watch(sees_senders=hasattr(signal, "sigtimedwait") and senders.available())
    previous = {each: signal.signal(each, watch.caught) for each in STOPPING}
    previous_wake = signal.signal(WAKE, watch.woken) if watch.sees_senders else None
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING) if watch.sees_senders else None
    _watch = watch
    try:
        if watch.sees_senders:
            watch.start()
        yield
    finally:
        try:
            watch.stop()
        finally:
            _watch = None
            if previous_mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
            if previous_wake is not None:
                signal.signal(WAKE, previous_wake)
            for each, handler in previous.items():
                signal.signal(each, handler)
