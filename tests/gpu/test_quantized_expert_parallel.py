"""Expert parallelism's fake-quantized gradients (fp8, nvfp4) and the negative tests of the nvfp4 scale.

The load, logits, routing and gradient checks of transformers' EP loading, for every MoE family (the mechanics
families per experts implementation, dtype and 2/4/8 ranks; every other declared family on 2 ranks, float32), run
at the start of each EP training case (test_training.py::test_training_steps), on the models it then trains: one
load serves both."""

from __future__ import annotations

import pytest
from checks.kinds import Check, Layout
from checks.rank_cases import WORLD_SIZES
from models import families
from models.families import NUM_EXPERTS

from harness.ranks import RankFailedError


# Fake quantization exercises the suite's own STE hooks on expert stacks, not a family mechanic: one family.
@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("quantized_moe"), indirect=True)
def test_ep_quantized_gradients(run_case, checkpoint, world_size, recipe):
    """Expert weights fake-quantized (STE): same quantized weights, routing and gradients as the whole model."""
    run_case(world_size, checkpoint, Layout.EP, (Check.QUANTIZED, Check.GRADIENTS), quant=recipe)


# The negative tests: an nvfp4 global scale computed over a rank's local experts instead of per expert.
# With one expert per rank the two scopes coincide, so only world sizes below 8 can show it.
LOCAL_SCALE_WORLD_SIZES = [size for size in WORLD_SIZES if size < NUM_EXPERTS]


@pytest.mark.parametrize("world_size", LOCAL_SCALE_WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("quantized_moe"), indirect=True)
def test_ep_nvfp4_scale_over_local_shard_fails_the_gradient_check(run_case, checkpoint, world_size):
    with pytest.raises(RankFailedError, match="gradients differ from the whole model's"):
        run_case(world_size, checkpoint, Layout.EP, (Check.GRADIENTS,), quant="nvfp4", quant_scope="local_shard")


@pytest.mark.parametrize("world_size", LOCAL_SCALE_WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("quantized_moe"), indirect=True)
def test_ep_nvfp4_scale_over_local_shard_is_named_by_the_quantized_check(run_case, checkpoint, world_size):
    """Before the gradients, the quantized-weights check names the layer, the matrix and the experts."""
    with pytest.raises(RankFailedError, match="quantized weights differ") as failure:
        run_case(world_size, checkpoint, Layout.EP, (Check.QUANTIZED, Check.GRADIENTS), quant="nvfp4",
                 quant_scope="local_shard")
    entry = families.family(checkpoint.family)
    stack = f"{entry.block_path(entry.moe_layers[0])}.{entry.experts}.gate_up_proj"
    assert f"nvfp4-quantized {stack} differs from the whole model's for experts" in str(failure.value)
