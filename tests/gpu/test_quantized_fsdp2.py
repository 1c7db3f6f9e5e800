"""FSDP2's fake-quantized gradients: transformers' FSDP2 loading and torch's bare fully_shard of a dense family.

The load, logits and gradient checks of FSDP2, bare fully_shard and FSDP2 + EP (every MoE family: the mechanics
families on 2/4/8 ranks and both dtypes, every other declared family on 2 ranks, float32) run first in each of
their training cases (test_training.py), on the models the case then trains: one load serves both."""

from __future__ import annotations

import pytest
from checks.kinds import Check, Layout
from checks.rank_cases import WORLD_SIZES
from models import families

# Layout.FSDP: from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=N));
# Layout.FULLY_SHARD: the whole model loaded, then fully_shard on each decoder layer and the root.
SHARDERS = (Layout.FSDP, Layout.FULLY_SHARD)


# Fake quantization exercises the suite's own STE hooks on dense MLPs, not a family mechanic: one family.
@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("sharder", SHARDERS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("quantized_dense"), indirect=True)
def test_fsdp_dense_quantized_gradients(run_case, checkpoint, world_size, sharder, recipe):
    """MLP weights fake-quantized (STE) after FSDP's all-gather: same quantized weights and gradients."""
    run_case(world_size, checkpoint, sharder, (Check.QUANTIZED, Check.GRADIENTS), quant=recipe)
