"""Checkpoints that leave the world they were written in (training/checkpointing.py): a torch.distributed.checkpoint
save resumed at another world size (DCP reshards), and save_pretrained from the sharded model loaded back whole.
One MoE family (EP, FSDP2+EP) and one dense family (FSDP2, bare fully_shard), as the other training variants.
A planted bug shows the resume check names the step."""

from __future__ import annotations

import pytest
from checks.kinds import Layout
from models import families

from harness.ranks import RankFailedError

MOE_LAYOUTS = (Layout.EP, Layout.FSDP_EP)
DENSE_LAYOUTS = (Layout.FSDP, Layout.FULLY_SHARD)
CASES = [(name, layout) for name in families.role("trained_moe") for layout in MOE_LAYOUTS] + [
    (name, layout) for name in families.role("trained_dense") for layout in DENSE_LAYOUTS]
# (the world that saves, the world that resumes)
WORLD_PAIRS = [(2, 4), (4, 2)]
SAVE_AT = 2


@pytest.mark.parametrize(("world_size", "resume_world_size"), WORLD_PAIRS, ids=[f"{a}to{b}" for a, b in WORLD_PAIRS])
@pytest.mark.parametrize(("checkpoint", "layout"), CASES, indirect=["checkpoint"])
def test_training_resumes_on_another_world_size(run_checkpoint_case, checkpoint, layout, world_size,
                                                resume_world_size):
    """Steps 1-2 at one world size, saved with torch.distributed.checkpoint; a fresh sharded model at the other
    loads it (DCP reshards), holds exactly the saved weights, and its steps 3-4 match the uninterrupted whole and
    float64 runs."""
    run_checkpoint_case(checkpoint, layout, "resume_other_world", world_size=world_size,
                        resume_world_size=resume_world_size, save_at=SAVE_AT)


@pytest.mark.parametrize(("checkpoint", "layout"), CASES, indirect=["checkpoint"])
@pytest.mark.world_size(2)
def test_save_pretrained_after_training_loads_back_whole(run_checkpoint_case, checkpoint, layout):
    """4 steps at 2 ranks, then save_pretrained from the sharded model (every rank calls it, rank 0 writes); the
    folder loaded whole holds the checkpoint's tensor names and the sharded model's full weights, bit for bit."""
    run_checkpoint_case(checkpoint, layout, "save_pretrained", world_size=2)


@pytest.mark.parametrize(("checkpoint", "layout"), CASES, indirect=["checkpoint"])
@pytest.mark.world_size(2)
def test_save_pretrained_of_a_full_state_dict_loads_back_whole(run_checkpoint_case, checkpoint, layout):
    """The same, passing torch's full state dict (get_model_state_dict with full_state_dict=True, gathered on every
    rank) as save_pretrained's `state_dict`: what a model sharded outside transformers (bare fully_shard) needs."""
    run_checkpoint_case(checkpoint, layout, "save_pretrained", world_size=2, full_state_dict=True)


# ---------------------------------------------------------------- planted bug: the check catches it


@pytest.mark.parametrize(("world_size", "resume_world_size"), WORLD_PAIRS, ids=[f"{a}to{b}" for a, b in WORLD_PAIRS])
@pytest.mark.parametrize("checkpoint", families.role("trained_moe"), indirect=True)
def test_a_resume_on_another_world_that_loads_stale_optimizer_state_is_caught(run_checkpoint_case, checkpoint,
                                                                               world_size, resume_world_size):
    with pytest.raises(RankFailedError, match=rf"step {SAVE_AT + 1}: updated parameters differ from the whole "
                                              r"model's"):
        run_checkpoint_case(checkpoint, Layout.FSDP_EP, "resume_other_world", world_size=world_size,
                            resume_world_size=resume_world_size, save_at=SAVE_AT, bug="stale_optimizer_state")
