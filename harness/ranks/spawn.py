"""One spawn per call: `run_distributed(world_size, fn, *args, timeout=..., device=...)` starts `world_size`
fresh rank processes (NCCL with one GPU each when CUDA is there, gloo on CPU otherwise), runs `fn(*args)`
on each and kills them. The pool (harness.ranks.pool) keeps the same ranks between calls instead; both
speak the protocol in harness.ranks.launcher, so they fail alike.

Needs only the standard library here and torch in the ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.ranks.failures import hidden_from_a_failure
from harness.ranks.launcher import RankSet, pickle_call, to_results
from harness.ranks.protocol import DEFAULT_TIMEOUT_S, OutputCapture, RankResult, collective_timeout


def run_distributed(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = DEFAULT_TIMEOUT_S,
                    device: str = "auto", capture: OutputCapture | None = None) -> list[RankResult]:
    """Run `fn(*args)` on `world_size` ranks with torch.distributed initialised; results in rank order.

    `device`: "cuda" (NCCL, GPU `rank` of the visible ones), "cpu" (gloo), or "auto" (cuda when there).
    `timeout` bounds `fn` from the moment every rank is ready; starting the ranks has its own deadline.
    `capture`: each rank's output in the call comes back in its result (and the error); None leaves it where the
    ranks' fds point.
    Raises `RankFailedError` (a rank raised or died) or `RankTimeoutError` (with every hung rank's stack).
    """
    __tracebackhide__ = hidden_from_a_failure
    payload = pickle_call(world_size, fn, args, device, caller="run_distributed")
    ranks = RankSet(world_size, device, collective_timeout_s=collective_timeout(timeout), capture=capture)
    try:
        ranks.spawn()
        ranks.wait_ready()
        return to_results(ranks.call(payload, timeout))
    finally:
        ranks.kill()
