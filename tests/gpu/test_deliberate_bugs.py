"""A defect planted on one rank after loading must fail the check that owns it, with a message naming it."""

from __future__ import annotations

import pytest
from rank_cases import WORLD_SIZES, Case
from tiny_models import BATCH_SIZE, NUM_EXPERTS, SEQUENCE_LENGTH

from harness.ranks import RankFailedError


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_expert_perturbed_on_one_rank_fails_the_load_check(run_case, moe_checkpoint, world_size):
    last_rank = world_size - 1
    per_rank = NUM_EXPERTS // world_size
    first = last_rank * per_rank
    perturbed = first + min(1, per_rank - 1)  # rank_cases.plant_bug: the second local expert, or the only one
    with pytest.raises(RankFailedError) as failure:
        run_case(world_size, moe_checkpoint, Case("ep", ("load", "logits"), bug="perturb_expert"))
    assert failure.value.rank == last_rank
    assert (f"rank {last_rank} holds experts {first}..{first + per_rank - 1} of "
            f"model.layers.0.mlp.experts.gate_up_proj, and expert {perturbed} ") in str(failure.value)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_router_perturbed_on_one_rank_fails_the_routing_check(run_case, moe_checkpoint, world_size):
    """Routing is checked before gradients: the flip is reported as such, not as the gradient error it causes."""
    with pytest.raises(RankFailedError) as failure:
        run_case(world_size, moe_checkpoint, Case("ep", ("gradients",), bug="perturb_router"))
    assert failure.value.rank == world_size - 1
    tokens = BATCH_SIZE * SEQUENCE_LENGTH  # expert parallelism: every rank routes the whole batch
    assert failure.value.summary.startswith("raised AssertionError: routing differs: layer 1 sends ")
    assert failure.value.summary.endswith(f" of {tokens} tokens to other experts than the whole model")
