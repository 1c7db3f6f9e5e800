"""FSDP2: transformers' FSDP2 loading and torch's bare fully_shard of the dense families, and FSDP2 + EP of
every MoE family (deep: the mechanics families on 2/4/8 ranks and both dtypes; wide: every other declared
family on 2 ranks, float32), against the whole model."""

from __future__ import annotations

import families
import pytest
from rank_cases import DTYPES, WORLD_SIZES

# "fsdp": from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=N));
# "fully_shard": the whole model loaded, then fully_shard on each decoder layer and the root.
SHARDERS = ("fsdp", "fully_shard")
DENSE = families.dense()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sharder", SHARDERS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", DENSE, indirect=True)
def test_fsdp_dense_load_and_logits(run_case, checkpoint, world_size, sharder, dtype):
    """Each rank holds its dim-0 chunk of every parameter; logits of its share of the batch match."""
    run_case(world_size, checkpoint, sharder, ("load", "logits"), dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sharder", SHARDERS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", DENSE, indirect=True)
def test_fsdp_dense_gradients(run_case, checkpoint, world_size, sharder, dtype):
    """Data split across ranks; gradients match the whole model's on the loss averaged the same way."""
    run_case(world_size, checkpoint, sharder, ("gradients",), dtype=dtype)


# Fake quantization exercises the suite's own STE hooks on dense MLPs, not a family mechanic: one family.
@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("sharder", SHARDERS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("quantized_dense"), indirect=True)
def test_fsdp_dense_quantized_gradients(run_case, checkpoint, world_size, sharder, recipe):
    """MLP weights fake-quantized (STE) after FSDP's all-gather: same quantized weights and gradients."""
    run_case(world_size, checkpoint, sharder, ("quantized", "gradients"), quant=recipe)


@pytest.mark.parametrize(
    ("checkpoint", "world_size", "dtype"),
    [
        pytest.param(name, world_size, dtype, marks=pytest.mark.deep)
        for name in families.deep_moe()
        for world_size in WORLD_SIZES
        for dtype in DTYPES
    ]
    + [pytest.param(name, 2, "float32", marks=pytest.mark.wide) for name in families.wide_moe()],
    indirect=["checkpoint"],
)
def test_fsdp_ep_moe(run_case, checkpoint, world_size, dtype):
    """A MoE under FSDP2 + EP: load, logits, routing, then gradients."""
    run_case(world_size, checkpoint, "fsdp_ep", ("load", "logits", "gradients"), dtype=dtype)
