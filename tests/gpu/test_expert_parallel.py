"""Expert parallelism: transformers' EP loading of the tiny Qwen3-MoE against the whole model."""

from __future__ import annotations

import pytest
from rank_cases import DTYPES, WORLD_SIZES, Case
from tiny_models import NUM_EXPERTS

from harness.ranks import RankFailedError


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ep_load_and_logits(run_case, moe_checkpoint, world_size, dtype):
    """Each rank holds its contiguous 1/world of the experts and the rest whole; logits match."""
    run_case(world_size, moe_checkpoint, Case("ep", ("load", "logits"), dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ep_gradients(run_case, moe_checkpoint, world_size, dtype):
    """Routing identical in every layer (checked first), then every gradient within the bound."""
    run_case(world_size, moe_checkpoint, Case("ep", ("gradients",), dtype=dtype))


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ep_quantized_gradients(run_case, moe_checkpoint, world_size, recipe):
    """Expert weights fake-quantized (STE): same quantized weights, routing and gradients as the whole model."""
    run_case(world_size, moe_checkpoint, Case("ep", ("quantized", "gradients"), quant=recipe))


# The negative tests: an nvfp4 global scale computed over a rank's local experts instead of per expert.
# With one expert per rank the two scopes coincide, so only world sizes below 8 can show it.
LOCAL_SCALE_WORLD_SIZES = [size for size in WORLD_SIZES if size < NUM_EXPERTS]


@pytest.mark.parametrize("world_size", LOCAL_SCALE_WORLD_SIZES)
def test_ep_nvfp4_scale_over_local_shard_fails_the_gradient_check(run_case, moe_checkpoint, world_size):
    case = Case("ep", ("gradients",), quant="nvfp4", quant_scope="local_shard")
    with pytest.raises(RankFailedError, match="gradients differ from the whole model's"):
        run_case(world_size, moe_checkpoint, case)


@pytest.mark.parametrize("world_size", LOCAL_SCALE_WORLD_SIZES)
def test_ep_nvfp4_scale_over_local_shard_is_named_by_the_quantized_check(run_case, moe_checkpoint, world_size):
    """Before the gradients, the quantized-weights check names the layer, the matrix and the experts."""
    case = Case("ep", ("quantized", "gradients"), quant="nvfp4", quant_scope="local_shard")
    with pytest.raises(RankFailedError, match="quantized weights differ") as failure:
        run_case(world_size, moe_checkpoint, case)
    assert "nvfp4-quantized model.layers.0.mlp.experts.gate_up_proj differs from the whole model's for experts" \
        in str(failure.value)
