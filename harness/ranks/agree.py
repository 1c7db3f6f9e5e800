"""Checks that fail together: run on every rank of a launch, a check that fails on some ranks fails on all.

A check that raises on one rank while its peers go on to their next collective leaves them waiting there:
the launcher then waits out the peer grace, kills the ranks and forks a new set for the next test. Inside
`together()` each rank's outcome is all-reduced first, so every rank leaves the block failing: the failing
ranks with their own error, the others with `PeerFailure`, which the launcher reports after the real ones
(protocol.failure_error). The rank set answers whole and is kept for the next test.

Only for checks whose collectives (a DTensor gathered to compare it) every rank reaches before any can raise:
a rank that raises between collectives of its own is a different failure, and the launcher's grace and stacks
are what report it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from harness.ranks.raised import PeerFailure


@contextlib.contextmanager
def together(what: str = "a check") -> Iterator[None]:
    """Every rank of the default process group leaves the block failing if any rank's block raised."""
    import torch
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    error: Exception | None = None
    try:
        yield
    except Exception as raised:  # an interrupt is not a verdict: it passes through without the collective
        error = raised
    # gloo reduces CPU tensors; NCCL only device tensors
    on_cpu = "gloo" in str(dist.get_backend())
    device = torch.device("cpu") if on_cpu else torch.device("cuda", torch.cuda.current_device())
    failed = torch.zeros(world_size, dtype=torch.int32, device=device)
    failed[rank] = error is not None
    dist.all_reduce(failed)
    failing = [other for other, flag in enumerate(failed.tolist()) if flag]
    if error is not None:
        raise error
    if failing:
        ranks = ", ".join(str(other) for other in failing)
        raise PeerFailure(f"rank {rank} passed {what}; stopped with rank{'s' if len(failing) > 1 else ''} {ranks}, "
                          f"which failed it")
