"""A defect planted on one rank after loading must fail the check that owns it, with a message naming the
parameter (or buffer) and the rank."""

from __future__ import annotations

import re

import pytest
from checks.kinds import Check, Layout
from checks.rank_cases import WORLD_SIZES
from models import families
from models.families import NUM_EXPERTS
from models.tiny_models import BATCH_SIZE, SEQUENCE_LENGTH

from harness.contract import GRAD_BOUND, GRAD_ERROR, GRAD_ERROR_PARAM
from harness.ranks import RankFailedError

# A 1% error in one rank's gradient must stay at least this far over its bound: bounds from the run's own rounding
# are tight enough to see subtle defects, not only gross ones (checks/tolerances.py).
SUBTLE_DEFECT_MARGIN = 100
LOAD_CHECKS = (Check.LOAD, Check.LOGITS)


def _fails_on_the_last_rank(run_case, checkpoint, world_size: int, checks: tuple[Check, ...],
                            bug: str) -> RankFailedError:
    """The EP case with `bug` planted on the last rank fails there; the other ranks stopped with it
    (harness.ranks.together) instead of waiting for it in the next collective: every rank answered, so the rank
    pool serves the next test."""
    with pytest.raises(RankFailedError) as failure:
        run_case(world_size, checkpoint, Layout.EP, checks, bug=bug)
    assert failure.value.rank == world_size - 1
    others = failure.value.other_failures
    assert len(others) == world_size - 1, others
    assert all(re.match(r"rank \d+ raised PeerFailure: ", other) for other in others), others
    return failure.value


def _expert_message(family: str, parameter: str, world_size: int) -> str:
    """The load check's words for planted.plant_bug's perturbed expert: the second local one, or the only one."""
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
    error = _fails_on_the_last_rank(run_case, checkpoint, world_size, LOAD_CHECKS, "perturb_expert")
    assert _expert_message(checkpoint.family, "gate_up_proj", world_size) in str(error)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("perturb_expert_bias"), indirect=True)
def test_expert_bias_perturbed_on_one_rank_fails_the_load_check(run_case, checkpoint, world_size):
    error = _fails_on_the_last_rank(run_case, checkpoint, world_size, LOAD_CHECKS, "perturb_expert_bias")
    assert _expert_message(checkpoint.family, "gate_up_proj_bias", world_size) in str(error)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("perturb_correction_bias"), indirect=True)
def test_correction_bias_altered_on_one_rank_fails_the_load_check(run_case, checkpoint, world_size):
    """A buffer, not a parameter: the load check compares buffers too."""
    error = _fails_on_the_last_rank(run_case, checkpoint, world_size, LOAD_CHECKS, "perturb_correction_bias")
    entry = families.family(checkpoint.family)
    buffer = f"{entry.router_paths()[0]}.e_score_correction_bias"
    assert f"rank {world_size - 1}'s buffer {buffer} differs from the whole model's after loading" in str(error)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("perturb_router"), indirect=True)
def test_router_perturbed_on_one_rank_fails_the_routing_check(run_case, checkpoint, world_size):
    """Routing is checked before gradients: the flip is reported as such, not as the gradient error it causes."""
    error = _fails_on_the_last_rank(run_case, checkpoint, world_size, (Check.GRADIENTS,), "perturb_router")
    tokens = BATCH_SIZE * SEQUENCE_LENGTH  # expert parallelism: every rank routes the whole batch
    assert error.summary.startswith("raised AssertionError: routing differs: layer 1 sends ")
    assert error.summary.endswith(f" of {tokens} tokens to other experts than the whole model")


def _measured(request) -> dict:
    """What the failing case recorded (its JUnit properties)."""
    return dict(request.node.user_properties)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("scale_expert_gradient"), indirect=True)
def test_expert_gradient_one_percent_off_on_one_rank_fails_far_over_its_bound(request, run_case, checkpoint,
                                                                               world_size):
    error = _fails_on_the_last_rank(run_case, checkpoint, world_size, (Check.GRADIENTS,), "scale_expert_gradient")
    entry = families.family(checkpoint.family)
    stack = f"{entry.block_path(entry.moe_layers[0])}.{entry.experts}.gate_up_proj"
    assert error.summary.startswith("raised AssertionError: gradients differ from the whole model's: 1 of ")
    measured = _measured(request)
    assert measured[GRAD_ERROR_PARAM] == stack
    assert measured[GRAD_ERROR] >= SUBTLE_DEFECT_MARGIN * measured[GRAD_BOUND], measured


@pytest.mark.parametrize("sharder", [Layout.FSDP, Layout.FULLY_SHARD])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", families.role("scale_shard_gradient"), indirect=True)
def test_fsdp_shard_gradient_one_percent_off_on_one_rank_fails_far_over_its_bound(request, run_case, checkpoint,
                                                                                  world_size, sharder):
    with pytest.raises(RankFailedError, match="gradients differ from the whole model's: 1 of "):
        run_case(world_size, checkpoint, sharder, (Check.GRADIENTS,), bug="scale_shard_gradient")
    measured = _measured(request)
    assert measured[GRAD_ERROR_PARAM].startswith(f"{families.family(checkpoint.family).layers_prefix}.0."), measured
    assert measured[GRAD_ERROR] >= SUBTLE_DEFECT_MARGIN * measured[GRAD_BOUND], measured
