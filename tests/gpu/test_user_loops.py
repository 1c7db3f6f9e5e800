"""The other two ways users train (training/user_loops.py):
accelerate's loop and transformers' Trainer on the sharded model,
compared after every step with the whole model's run of the same arithmetic, with training/steps.py's checks. EP and
FSDP2+EP of the trained MoE family, FSDP2 and bare fully_shard of the trained dense one, 2 ranks.

Where a library refuses a layout on these ranks at setup (accelerate's ParallelismConfig on DistributedType.MULTI_CPU,
FSDP declined there), the case is not run, with the library's words. One planted bug shows that a Trainer that
skips an optimizer step on one rank is caught, naming the step."""

from __future__ import annotations

import pytest
from checks.kinds import Layout
from models import families
from training.user_loops import BUG_STEP, LOOPS

from harness.ranks import RankFailedError

WORLD_SIZE = 2
pytestmark = pytest.mark.world_size(WORLD_SIZE)  # packing gives each test its 2 ranks' cores or GPUs
CASES = [(name, layout) for name in families.role("trained_moe") for layout in (Layout.EP, Layout.FSDP_EP)] + [
    (name, layout) for name in families.role("trained_dense") for layout in (Layout.FSDP, Layout.FULLY_SHARD)]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(("checkpoint", "layout"), CASES, indirect=["checkpoint"])
def test_user_loop_matches_the_whole_model(run_user_loop, checkpoint, layout, loop):
    """Per step: replicated parameters bit-identical across ranks; loss, accumulated gradients, gradient norm and
    updated parameters within the whole runs' bounds."""
    run_user_loop(WORLD_SIZE, checkpoint, layout, loop)


@pytest.mark.parametrize("checkpoint", families.role("trained_dense"), indirect=True)
def test_a_trainer_skipping_one_optimizer_step_on_one_rank_is_named_with_its_step(run_user_loop, checkpoint):
    with pytest.raises(RankFailedError, match=rf"step {BUG_STEP}: updated parameters differ from the whole model's"):
        run_user_loop(WORLD_SIZE, checkpoint, Layout.FSDP, "trainer", bug="skip_optimizer_step")
