"""FSDP2: transformers' FSDP2 loading and torch's bare fully_shard, against the whole model."""

from __future__ import annotations

import pytest
from rank_cases import DTYPES, WORLD_SIZES, Case

# "fsdp": from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=N));
# "fully_shard": the whole model loaded, then fully_shard on each decoder layer and the root.
SHARDERS = ("fsdp", "fully_shard")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sharder", SHARDERS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_fsdp_dense_load_and_logits(run_case, dense_checkpoint, world_size, sharder, dtype):
    """Each rank holds its dim-0 chunk of every parameter; logits of its share of the batch match."""
    run_case(world_size, dense_checkpoint, Case(sharder, ("load", "logits"), dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sharder", SHARDERS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_fsdp_dense_gradients(run_case, dense_checkpoint, world_size, sharder, dtype):
    """Data split across ranks; gradients match the whole model's on the loss averaged the same way."""
    run_case(world_size, dense_checkpoint, Case(sharder, ("gradients",), dtype=dtype))


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("sharder", SHARDERS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_fsdp_dense_quantized_gradients(run_case, dense_checkpoint, world_size, sharder, recipe):
    """MLP weights fake-quantized (STE) after FSDP's all-gather: same quantized weights and gradients."""
    run_case(world_size, dense_checkpoint, Case(sharder, ("quantized", "gradients"), quant=recipe))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_fsdp_ep_moe(run_case, moe_checkpoint, world_size, dtype):
    """The MoE under FSDP2 + EP: load, logits, routing, then gradients."""
    run_case(world_size, moe_checkpoint, Case("fsdp_ep", ("load", "logits", "gradients"), dtype=dtype))
