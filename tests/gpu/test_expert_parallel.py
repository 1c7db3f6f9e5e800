"""Expert parallelism: transformers' EP loading of every MoE family against the whole model.

Deep (the mechanics families): every experts implementation the release offers, both dtypes, 2/4/8 ranks. Every
other family the release declares an EP plan for (wide: one implementation, float32, 2 ranks) is checked the same
way at the start of its EP training case (test_training.py)."""

from __future__ import annotations

import families
import pytest
from families import NUM_EXPERTS
from rank_cases import DTYPES, WORLD_SIZES
from tf_adapter import PORTABLE_EXPERTS_IMPLEMENTATIONS

from harness.ranks import RankFailedError

DEEP = families.deep_moe()


def _deep(test):
    """The full cross over the mechanics families. The wide families' EP load, logits and gradient checks run
    first in their training cases (test_training.py), on the models the case then trains."""
    deep = [
        pytest.param(name, implementation, world_size, dtype, marks=pytest.mark.deep)
        for name in DEEP
        for implementation in PORTABLE_EXPERTS_IMPLEMENTATIONS
        for world_size in WORLD_SIZES
        for dtype in DTYPES
    ]
    return pytest.mark.parametrize(
        ("checkpoint", "experts_implementation", "world_size", "dtype"),
        deep,
        indirect=["checkpoint"],
    )(test)


@_deep
def test_ep_load_logits_and_gradients(run_case, checkpoint, experts_implementation, world_size, dtype):
    """One load serves every check, in order: each rank holds its contiguous 1/world of the experts and the rest
    whole (weights, biases, buffers); logits match; routing identical in every MoE layer; then every gradient within
    the dtype's bound."""
    run_case(world_size, checkpoint, "ep", ("load", "logits", "gradients"), dtype=dtype,
             experts_implementation=experts_implementation)


# Fake quantization exercises the suite's own STE hooks on expert stacks, not a family mechanic: one family.
@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("quantized_moe"), indirect=True)
def test_ep_quantized_gradients(run_case, checkpoint, world_size, recipe):
    """Expert weights fake-quantized (STE): same quantized weights, routing and gradients as the whole model."""
    run_case(world_size, checkpoint, "ep", ("quantized", "gradients"), quant=recipe)


# The negative tests: an nvfp4 global scale computed over a rank's local experts instead of per expert.
# With one expert per rank the two scopes coincide, so only world sizes below 8 can show it.
LOCAL_SCALE_WORLD_SIZES = [size for size in WORLD_SIZES if size < NUM_EXPERTS]


@pytest.mark.parametrize("world_size", LOCAL_SCALE_WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("quantized_moe"), indirect=True)
def test_ep_nvfp4_scale_over_local_shard_fails_the_gradient_check(run_case, checkpoint, world_size):
    with pytest.raises(RankFailedError, match="gradients differ from the whole model's"):
        run_case(world_size, checkpoint, "ep", ("gradients",), quant="nvfp4", quant_scope="local_shard")


@pytest.mark.parametrize("world_size", LOCAL_SCALE_WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("quantized_moe"), indirect=True)
def test_ep_nvfp4_scale_over_local_shard_is_named_by_the_quantized_check(run_case, checkpoint, world_size):
    """Before the gradients, the quantized-weights check names the layer, the matrix and the experts."""
    with pytest.raises(RankFailedError, match="quantized weights differ") as failure:
        run_case(world_size, checkpoint, "ep", ("quantized", "gradients"), quant="nvfp4", quant_scope="local_shard")
    entry = families.family(checkpoint.family)
    stack = f"{entry.block_path(entry.moe_layers[0])}.{entry.experts}.gate_up_proj"
    assert f"nvfp4-quantized {stack} differs from the whole model's for experts" in str(failure.value)
