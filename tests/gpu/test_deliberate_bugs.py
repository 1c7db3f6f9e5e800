"""A defect planted on one rank after loading must fail the check that owns it, with a message naming the
parameter (or buffer) and the rank."""

from __future__ import annotations

import re

import families
import pytest
from families import NUM_EXPERTS
from rank_cases import WORLD_SIZES
from tiny_models import BATCH_SIZE, SEQUENCE_LENGTH

from harness.ranks import RankFailedError


def _failed_together(failure, world_size: int) -> None:
    """The other ranks stopped with the failing one (harness.ranks.together) instead of waiting for it in the
    next collective: every rank answered, so the rank pool serves the next test."""
    others = failure.value.other_failures
    assert len(others) == world_size - 1, others
    assert all(re.match(r"rank \d+ raised PeerFailure: ", other) for other in others), others


def _expert_message(family: str, parameter: str, world_size: int) -> str:
    """The load check's words for rank_cases.plant_bug's perturbed expert: the second local one, or the only one."""
    entry = families.family(family)
    last_rank = world_size - 1
    per_rank = NUM_EXPERTS // world_size
    first = last_rank * per_rank
    perturbed = first + min(1, per_rank - 1)
    name = f"{entry.block_path(entry.moe_layers[0])}.{entry.experts}.{parameter}"
    return f"rank {last_rank} holds experts {first}..{first + per_rank - 1} of {name}, and expert {perturbed} "


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("perturb_expert"), indirect=True)
def test_expert_perturbed_on_one_rank_fails_the_load_check(run_case, checkpoint, world_size):
    with pytest.raises(RankFailedError) as failure:
        run_case(world_size, checkpoint, "ep", ("load", "logits"), bug="perturb_expert")
    assert failure.value.rank == world_size - 1
    _failed_together(failure, world_size)
    assert _expert_message(checkpoint.family, "gate_up_proj", world_size) in str(failure.value)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("perturb_expert_bias"), indirect=True)
def test_expert_bias_perturbed_on_one_rank_fails_the_load_check(run_case, checkpoint, world_size):
    with pytest.raises(RankFailedError) as failure:
        run_case(world_size, checkpoint, "ep", ("load", "logits"), bug="perturb_expert_bias")
    assert failure.value.rank == world_size - 1
    _failed_together(failure, world_size)
    assert _expert_message(checkpoint.family, "gate_up_proj_bias", world_size) in str(failure.value)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("perturb_correction_bias"), indirect=True)
def test_correction_bias_altered_on_one_rank_fails_the_load_check(run_case, checkpoint, world_size):
    """A buffer, not a parameter: the load check compares buffers too."""
    with pytest.raises(RankFailedError) as failure:
        run_case(world_size, checkpoint, "ep", ("load", "logits"), bug="perturb_correction_bias")
    assert failure.value.rank == world_size - 1
    _failed_together(failure, world_size)
    entry = families.family(checkpoint.family)
    buffer = f"{entry.router_paths()[0]}.e_score_correction_bias"
    assert f"rank {world_size - 1}'s buffer {buffer} differs from the whole model's after loading" in str(failure.value)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("perturb_router"), indirect=True)
def test_router_perturbed_on_one_rank_fails_the_routing_check(run_case, checkpoint, world_size):
    """Routing is checked before gradients: the flip is reported as such, not as the gradient error it causes."""
    with pytest.raises(RankFailedError) as failure:
        run_case(world_size, checkpoint, "ep", ("gradients",), bug="perturb_router")
    assert failure.value.rank == world_size - 1
    _failed_together(failure, world_size)
    tokens = BATCH_SIZE * SEQUENCE_LENGTH  # expert parallelism: every rank routes the whole batch
    assert failure.value.summary.startswith("raised AssertionError: routing differs: layer 1 sends ")
    assert failure.value.summary.endswith(f" of {tokens} tokens to other experts than the whole model")
