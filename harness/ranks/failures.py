"""The errors a launch raises (`DistributedError` and its kinds), built in one order from what the ranks answered."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Mapping
from typing import Any

from harness.ranks.protocol import Done, Failed, RankOutput
from harness.ranks.raised import RaisingFrame


class DistributedError(Exception):
    """A launch did not complete on every rank. `rank_seconds`: how long fn ran on each rank (None: unknown);
    `rank_modules`: what the ranks imported (the pool preloads them); `rank_outputs`: what each rank wrote in
    the call, up to its end or the moment it died or was killed (empty: not captured)."""

    def __init__(self, text: str, rank_seconds: list[float | None], rank_modules: list[str],
                 rank_outputs: dict[int, RankOutput] | None = None):
        super().__init__(text)
        self.rank_seconds = rank_seconds
        self.rank_modules = rank_modules
        self.rank_outputs = rank_outputs or {}


def hidden_from_a_failure(excinfo: Any) -> bool:
    """`__tracebackhide__` of harness's frames between a test and its ranks (pytest calls it with the failure's
    ExceptionInfo): a launch's error, a rank that raised or hung or a host lost, leads with the test's own line and
    the rank's traceback in the message, not with the launcher's loop. Anything else (a bug of harness, pytest-timeout,
    Ctrl-C) keeps the frames: there they are where to look."""
    return isinstance(getattr(excinfo, "value", None), DistributedError)


class RankFailedError(DistributedError):
    """A rank raised, or exited without a result. `rank` is the first one that failed; `other_failures` the
    collateral: later errors, and the ranks still running with their stacks. `error_type` / `error_message`:
    what that rank raised (its exception's qualname and first line), as data for whoever matches on it (the
    suite's known upstream bugs), and `error_frame` where it raised it; None when it exited without a word.
    `exited`: that rank exited without a result (a signal, an exit code) instead of raising."""

    def __init__(self, rank: int, summary: str, details: str, other_failures: list[str], *,
                 rank_seconds: list[float | None] | None = None, rank_modules: list[str] | None = None,
                 error_type: str | None = None, error_message: str | None = None,
                 error_frame: RaisingFrame | None = None,
                 rank_outputs: dict[int, RankOutput] | None = None, exited: bool = False):
        self.rank = rank
        self.error_type = error_type
        self.error_message = error_message
        self.error_frame = error_frame
        self.summary = summary
        self.details = details
        self.other_failures = other_failures
        self.exited = exited
        text = f"rank {rank} {summary}\n\n{details}"
        if other_failures:
            text += "\nafterwards:\n" + "\n".join(f"  {line}" for line in other_failures)
        super().__init__(text, rank_seconds or [], rank_modules or [], rank_outputs)


class RankTimeoutError(DistributedError):
    """Ranks still ran at the deadline; `stacks` maps each rank to its Python stack (or what it did).
    `hung_first`: the ranks that were not waiting in a torch.distributed call, so the others wait for them;
    their stacks come first."""

    def __init__(self, timeout_s: float, hung_ranks: list[int], stacks: dict[int, str], *,
                 rank_seconds: list[float | None] | None = None, rank_outputs: dict[int, RankOutput] | None = None):
        self.timeout_s = timeout_s
        self.hung_ranks = hung_ranks
        self.stacks = stacks
        waiting = [rank for rank in hung_ranks if in_collective(stacks.get(rank, ""))]
        self.hung_first = [rank for rank in hung_ranks if rank not in waiting]
        head = f"ranks {hung_ranks} still running after {timeout_s:g}s; killed."
        if self.hung_first and waiting:
            head += f" Hung first: ranks {self.hung_first}; ranks {waiting} waited for them in a collective."
        parts = [f"{head} Python stack of every rank:"]
        order = self.hung_first + waiting + sorted(rank for rank in stacks if rank not in hung_ranks)
        parts += [f"--- rank {rank} ---\n{stacks[rank].rstrip()}" for rank in order]
        super().__init__("\n".join(parts), rank_seconds or [], [], rank_outputs)


class HostLostError(DistributedError):
    """A host of the cell went silent (no heartbeat) or its agent's connection closed: the cell cannot go on.
    `host` is the one that went silent first, which is not always the one whose connection closed first."""

    def __init__(self, host: int, hostname: str, reason: str):
        self.host = host
        self.hostname = hostname
        self.reason = reason
        super().__init__(f"host {host} ({hostname}) lost: {reason}", [], [])


def in_collective(stack: str) -> bool:
    """Whether faulthandler's dump shows the rank's current thread inside torch.distributed (innermost frame
    first): a rank there waits for its peers."""
    current = stack.split("Current thread", 1)
    frames = [line.strip() for line in current[1].splitlines()[1:] if line.strip().startswith("File ")] \
        if len(current) == 2 else []
    return bool(frames) and f"{os.sep}torch{os.sep}distributed{os.sep}" in frames[0]


# ---------------------------------------------------------------- building the errors


NO_STACK = "(no stack written: the rank did not answer SIGUSR1)"


@dataclasses.dataclass(frozen=True)
class Died:
    """A rank that exited without a word: `exit_code` as multiprocessing reports it (None: unknown)."""

    exit_code: int | None
    last_stack: str
    output: RankOutput | None = None  # what it wrote in the call before it died, read from its files


def failure_error(world_size: int, replies: dict[int, Done], failures: Mapping[int, Failed | Died],
                  running_stacks: dict[int, str], running_outputs: dict[int, RankOutput] | None = None
                  ) -> RankFailedError:
    """The error for a launch in which `failures` happened, naming first the rank that failed first.

    A rank that died without a word sorts first: its peers' errors (a connection reset) follow from it, and
    when it died is unknown (only when it was noticed). Then the earliest error of a rank's own, then the
    ranks that stopped because a peer failed; the ranks still running (with their stacks) come last."""
    # (order, rank, summary, details, the Failed where the rank raised)
    found: list[tuple[tuple[int, float], int, str, str, Failed | None]] = []
    for rank, failure in failures.items():
        if isinstance(failure, Failed):
            order = (2 if failure.follows_peer else 1, failure.failed_at)
            found.append((order, rank, f"raised {failure.error_type}: {failure.error_message}",
                          failure.traceback, failure))
        else:
            details = (f"last Python stack of rank {rank}:\n{failure.last_stack}" if failure.last_stack
                       else "no Python stack was written")
            found.append(((0, rank), rank, f"exited {describe_exit(failure.exit_code)} without a result", details,
                          None))
    found.sort(key=lambda entry: entry[0])
    _, rank, summary, details, raised = found[0]
    others = [f"rank {other} {other_summary}" for _, other, other_summary, _, _ in found[1:]]
    others += [f"rank {other} was still running and was killed; its Python stack:\n{stack.rstrip()}"
               for other, stack in sorted(running_stacks.items())]
    seconds = [_seconds(replies.get(each) or failures.get(each)) for each in range(world_size)]
    modules = [name for outcome in (*replies.values(), *failures.values()) for name in getattr(outcome, "modules", ())]
    return RankFailedError(rank, summary, details, others, rank_seconds=seconds, rank_modules=modules,
                           error_type=raised.error_type if raised else None,
                           error_message=raised.error_message if raised else None,
                           error_frame=raised.error_frame if raised else None,
                           rank_outputs=_outputs(replies, failures, running_outputs), exited=raised is None)


def timeout_error(world_size: int, timeout_s: float, replies: dict[int, Done],
                  running_stacks: dict[int, str], running_outputs: dict[int, RankOutput] | None = None
                  ) -> RankTimeoutError:
    stacks = dict(running_stacks)
    stacks.update({rank: "(finished: returned its result)" for rank in replies})
    return RankTimeoutError(timeout_s, sorted(running_stacks), stacks,
                            rank_seconds=[_seconds(replies.get(rank)) for rank in range(world_size)],
                            rank_outputs=_outputs(replies, {}, running_outputs))


def _seconds(outcome: Any) -> float | None:
    return getattr(outcome, "seconds", None)


def _outputs(replies: dict[int, Done], failures: Mapping[int, Failed | Died],
             running_outputs: dict[int, RankOutput] | None) -> dict[int, RankOutput]:
    """Each rank's output in a launch that failed: from its answer, or as read from its files (no answer)."""
    outputs = {rank: outcome.output for rank, outcome in (*replies.items(), *failures.items())
               if outcome.output is not None}
    return {**outputs, **(running_outputs or {})}


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "(exit status unknown)"
    if exitcode < 0:
        return f"by signal {signal.Signals(-exitcode).name}"
    return f"with code {exitcode}"
