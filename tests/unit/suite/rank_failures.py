"""A rank's failure as the ranks fixture raises it, for the known-bugs tests and the test files they write."""

from __future__ import annotations

from harness.ranks.failures import failure_error
from harness.ranks.protocol import Failed
from harness.ranks.raised import RaisingFrame

# Where torch 2.13.0 raised the inkling_text / muse_spark_text EP cases' bare AssertionError (the reproduction).
REDUCE_VALUE = RaisingFrame("torch/distributed/tensor/placement_types.py", "_reduce_value", 1703)


def rank_raised(error_type: str, message: str, raised_at: RaisingFrame | None = None):
    """The ranks fixture's error for a launch in which rank 1 raised `error_type: message` (at `raised_at`)."""
    failure = Failed(failed_at=1.0, error_type=error_type, error_message=message, traceback="Traceback: ...",
                     error_frame=raised_at)
    return failure_error(2, {}, {1: failure}, {})
