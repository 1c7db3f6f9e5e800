"""Training as users train: the same N-step loop (AdamW, gradient clipping, a warm-up schedule, 2 micro-batches
accumulated) on the sharded model and the whole model, compared after every step (training/steps.py). Each layout's
case first runs the one-step checks (load, logits, routing, gradients) on the models it then trains: FSDP2+EP,
FSDP2, bare fully_shard and the wide EP cases have no one-step test of their own.

Deep (the mechanics families): EP and FSDP2+EP of every MoE family, FSDP2 and bare fully_shard of the dense ones,
2/4/8 ranks, both dtypes. Wide (every other declared EP family): EP and FSDP2+EP, float32, 2 ranks. AdamW's
kernels (foreach off, fused), torch's own clip_grad_norm_ and a checkpoint resumed mid-run: one family per layout.
Two planted bugs show that the checks name the step."""

from __future__ import annotations

import pytest
from checks.kinds import Layout
from checks.rank_cases import DTYPES, WORLD_SIZES
from loading.tf_adapter import PORTABLE_EXPERTS_IMPLEMENTATIONS
from models import families

from harness import contract
from harness.ranks import RankFailedError
from harness.ranks.plugin import pool_mode

# FSDP2+EP first: a family's EP case fails more often (EP alone has more known bugs), and a case that fails keeps
# no whole runs for the next layout to reuse (steps.WholeRuns)
MOE_LAYOUTS = (Layout.FSDP_EP, Layout.EP)
DENSE_LAYOUTS = (Layout.FSDP, Layout.FULLY_SHARD)
STEPS = 3


# Collection reads the registry's names only (building a family's tiny model belongs to its cases: an older
# release that cannot build one must not fail the collection of every case).
# The mechanics MoE families run every experts implementation (the dense ones have none: None, their own forward).
# A family's layouts one after the other (innermost): they share the whole model's runs (steps.WholeRuns).
DEEP_FAMILIES = [(name, PORTABLE_EXPERTS_IMPLEMENTATIONS, MOE_LAYOUTS) for name in families.deep_moe()] + [
    (name, (None,), DENSE_LAYOUTS) for name in families.dense()]
DEEP = [
    pytest.param(name, layout, world_size, dtype, implementation, marks=pytest.mark.deep)
    for name, implementations, layouts in DEEP_FAMILIES
    for world_size in WORLD_SIZES
    for dtype in DTYPES
    for implementation in implementations
    for layout in layouts
]
# A wide family's implementation is resolved by its case (families.wide_implementation builds its model)
WIDE_IMPLEMENTATION = "wide"
WIDE = [
    pytest.param(name, layout, 2, "float32", WIDE_IMPLEMENTATION, marks=pytest.mark.wide)
    for name in families.wide_moe()
    for layout in MOE_LAYOUTS
]


def implementation_for(name: str, layout: Layout, implementation: str | None) -> str | None:
    """A wide family's EP cases run the wide experts implementation, its FSDP2+EP cases the model's own (None); a
    deep case runs the one it names."""
    if implementation != WIDE_IMPLEMENTATION:
        return implementation
    return families.wide_implementation(name) if layout == Layout.EP else None


@pytest.mark.parametrize(("checkpoint", "layout", "world_size", "dtype", "experts_implementation"), DEEP + WIDE,
                         indirect=["checkpoint"], ids=lambda value: "default" if value is None else None)
def test_training_steps(run_training, checkpoint, layout, world_size, dtype, experts_implementation):
    """One load serves every check of a layout: the load, then one forward and backward (logits, routing, gradients:
    the one-step checks), then per training step: replicated parameters bit-identical across ranks; loss, global
    gradient norm and every updated parameter within the whole run's bounds. The mechanics MoE families run every
    experts implementation the release offers, both dtypes and 2/4/8 ranks; every other declared family EP and
    FSDP2+EP on 2 ranks, float32."""
    run_training(world_size, checkpoint, layout, dtype=dtype, steps=STEPS, one_step=True,
                 experts_implementation=implementation_for(checkpoint.family, layout, experts_implementation))


# AdamW's other kernels, resuming and torch's own clipping: one MoE and one dense family, each of their layouts.
TRAINED_MOE = families.role("trained_moe")
KERNEL_CASES = [(name, layout) for name in TRAINED_MOE for layout in MOE_LAYOUTS] + [
    (name, layout) for name in families.role("trained_dense") for layout in DENSE_LAYOUTS]


@pytest.mark.parametrize("optimizer", ["foreach_off", "fused"])
@pytest.mark.parametrize(("checkpoint", "layout"), KERNEL_CASES, indirect=["checkpoint"])
@pytest.mark.world_size(2)
def test_training_optimizer_kernels(run_training, checkpoint, layout, optimizer):
    run_training(2, checkpoint, layout, steps=STEPS, optimizer=optimizer)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize(("checkpoint", "layout"), KERNEL_CASES, indirect=["checkpoint"])
def test_training_resumes_from_a_sharded_checkpoint(run_training, checkpoint, layout, world_size):
    """Saved with torch.distributed.checkpoint after step 2, loaded into a freshly loaded sharded model with a new
    optimizer and schedule; steps 3-4 match the uninterrupted whole run."""
    run_training(world_size, checkpoint, layout, steps=4, resume_at=2)


@pytest.mark.parametrize(("checkpoint", "layout"), KERNEL_CASES, indirect=["checkpoint"])
@pytest.mark.world_size(2)
def test_training_clips_with_torch_clip_grad_norm(run_training, checkpoint, layout):
    """The loop as most users write it: torch.nn.utils.clip_grad_norm_ on the sharded model's parameters (the
    other cases clip per device mesh where a layout puts parameters on several, as transformers' Trainer does)."""
    run_training(2, checkpoint, layout, steps=STEPS, clip="torch")


# FSDP2's MixedPrecisionPolicy (bfloat16 compute, float32 parameters and gradient reduction): transformers' own
# (DistributedConfig(fsdp_mixed_precision=True)) on its FSDP2 layouts and torch's on bare fully_shard.
MIXED_PRECISION_CASES = [(name, layout) for name in TRAINED_MOE for layout in (Layout.FSDP_EP,)] + [
    (name, layout) for name in families.dense() for layout in DENSE_LAYOUTS]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize(("checkpoint", "layout"), MIXED_PRECISION_CASES, indirect=["checkpoint"])
def test_training_in_mixed_precision(run_training, checkpoint, layout, world_size):
    """bfloat16 forward and backward on float32 parameters, gradients reduced and accumulated in float32, against
    the whole model computing the same way (a bfloat16 copy of its float32 parameters per micro-batch)."""
    run_training(world_size, checkpoint, layout, dtype="bfloat16", steps=STEPS, mixed_precision=True)


LAYOUT_PAIRS = [(name, MOE_LAYOUTS) for name in TRAINED_MOE] + [(name, DENSE_LAYOUTS)
                                                                 for name in families.role("trained_dense")]


@pytest.mark.parametrize(("checkpoint", "layouts"), LAYOUT_PAIRS, indirect=["checkpoint"])
@pytest.mark.world_size(2)
def test_a_familys_layouts_share_the_whole_models_runs(request, run_training, checkpoint, layouts):
    """The second layout compares with the whole runs the first made (steps.WholeRuns) only because they are the
    same computation: made again from scratch, they are the same numbers, bit for bit."""
    first, second = layouts
    # made here, whatever an earlier test of the family left in the session's handover folder (any test order)
    made = run_training(2, checkpoint, first, steps=STEPS, reuse_whole_runs=False)
    again = run_training(2, checkpoint, second, steps=STEPS, reuse_whole_runs=False)
    reused = run_training(2, checkpoint, second, steps=STEPS)
    whole_losses = [contract.WHOLE_LOSS_STEP.format(step=step) for step in range(1, STEPS + 1)]
    assert [made[name] for name in whole_losses] == [again[name] for name in whole_losses]
    assert (made[contract.WHOLE_RUNS], again[contract.WHOLE_RUNS]) == ("made", "made")
    # with the rank pool off every call starts fresh ranks: nothing to reuse
    assert reused[contract.WHOLE_RUNS] == ("made" if pool_mode(request.config) is None else "reused")
    assert [reused[name] for name in whole_losses] == [made[name] for name in whole_losses]


# ---------------------------------------------------------------- planted bugs: the checks catch them


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("checkpoint", TRAINED_MOE, indirect=True)
def test_a_rank_skipping_one_replicated_update_is_named_with_its_step(run_training, checkpoint, world_size):
    with pytest.raises(RankFailedError, match=rf"step 2: parameter \S*norm\S* differs across ranks "
                                              rf"\(rank {world_size - 1} vs rank 0: "):
        run_training(world_size, checkpoint, Layout.EP, steps=STEPS, bug="skip_replicated_update")


@pytest.mark.parametrize("layout", MOE_LAYOUTS)
@pytest.mark.parametrize("checkpoint", TRAINED_MOE, indirect=True)
@pytest.mark.world_size(2)
def test_a_resume_that_loads_stale_optimizer_state_is_caught(run_training, checkpoint, layout):
    with pytest.raises(RankFailedError, match=r"step 3: updated parameters differ from the whole model's"):
        run_training(2, checkpoint, layout, steps=4, resume_at=2, bug="stale_optimizer_state")
