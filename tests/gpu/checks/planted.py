"""Every defect the suite plants on purpose, to show that a check can fail: the deliberate-bug tests
(test_planted_bugs.py) and the planted-bug tests at the end of test_training.py, test_user_loops.py and
test_training_checkpoints.py. A case names its defect in `bug`; its kind of case refuses a name not listed here for
it. The load and gradient defects are planted here; the training, user-loop and checkpoint ones act inside their
loops (training/steps.py, training/user_loops.py, training/checkpointing.py), where the step they spoil runs."""

from __future__ import annotations

import torch
from models import families
from torch.distributed.tensor import DTensor

from checks.tensors import local

# The one-step checks' (rank_cases.Case): planted on the last rank after loading (plant_bug)
LOAD_BUGS = ("perturb_expert", "perturb_router", "perturb_expert_bias", "perturb_correction_bias")
# ... and after the backward: one rank's gradient 1% off (its experts under EP; its shard under FSDP2), the subtle
# defect every bound must still catch by a wide margin
GRADIENT_BUGS = ("scale_expert_gradient", "scale_shard_gradient")
ONE_STEP_BUGS = LOAD_BUGS + GRADIENT_BUGS
SUBTLE_GRADIENT_SCALE = 1.01
# Training cases' (training/steps.py): the update of one replicated parameter skipped at step 2 on the last rank;
# the optimizer state of the step before `resume_at` loaded on resume instead of its own
TRAINING_BUGS = ("skip_replicated_update", "stale_optimizer_state")
# User loops' (training/user_loops.py): the last rank's loop skips the optimizer's update at its BUG_STEP
USER_LOOP_BUGS = ("skip_optimizer_step",)
# Checkpoint cases' (training/checkpointing.py): phase 2 loads the optimizer state saved after step k-1 instead of
# step k's (every rank)
CHECKPOINT_BUGS = ("stale_optimizer_state",)




def plant_bug(model, family: families.Family, bug: str) -> None:
    """A defect on this rank only, after loading (the deliberate-bug tests plant it on the last rank)."""
    first_moe, last_moe = (
        model.get_submodule(family.block_path(layer)) for layer in (family.moe_layers[0], family.moe_layers[-1])
    )
    experts = getattr(first_moe, family.experts)
    with torch.no_grad():
        if bug == "perturb_expert":
            # the second local expert (or the only one) of the first MoE layer: 10% of the weights' scale added
            stack = local(experts.gate_up_proj)
            stack[min(1, stack.shape[0] - 1)] += 0.1 * families.INITIALIZER_RANGE
        elif bug == "perturb_router":
            # the last MoE layer's router scores the first two experts the other way round on this rank
            _, weight, transposed = families.router_weight(getattr(last_moe, family.router))
            weight = local(weight)
            if transposed:
                weight[:, [0, 1]] = weight[:, [1, 0]]
            else:
                weight[[0, 1]] = weight[[1, 0]]
        elif bug == "perturb_expert_bias":
            # GPT-OSS: the second local expert's gate/up bias of the first MoE layer shifted by 0.1
            bias = local(experts.gate_up_proj_bias)
            bias[min(1, bias.shape[0] - 1)] += 0.1
        elif bug == "perturb_correction_bias":
            # DeepSeek-V3: the first MoE layer's correction-bias buffer shifted (too little to flip a route)
            getattr(first_moe, family.router).e_score_correction_bias.add_(0.01)
        else:
            raise ValueError(f"unknown bug {bug!r}; known: {LOAD_BUGS}")


def plant_gradient_bug(model, family: families.Family, bug: str) -> None:
    """This rank's gradient of one parameter made 1% larger after the backward, as a defect in its backward would:
    its local experts' gate/up stack in the first MoE layer (EP), or its shard of the first FSDP-sharded
    parameter (FSDP2)."""
    with torch.no_grad():
        if bug == "scale_expert_gradient":
            first_moe = model.get_submodule(family.block_path(family.moe_layers[0]))
            local(_grad(getattr(first_moe, family.experts).gate_up_proj)).mul_(SUBTLE_GRADIENT_SCALE)
        elif bug == "scale_shard_gradient":
            local(_grad(first_layer_shard(model, family))).mul_(SUBTLE_GRADIENT_SCALE)
        else:
            raise ValueError(f"unknown gradient bug {bug!r}; known: {GRADIENT_BUGS}")


def first_layer_shard(model, family: families.Family) -> DTensor:
    """The first FSDP-sharded parameter of the first decoder layer."""
    prefix = f"{family.layers_prefix}.0."
    return next(
        param for name, param in model.named_parameters() if name.startswith(prefix) and isinstance(param, DTensor)
    )


def _grad(param: torch.Tensor) -> torch.Tensor:
    """The gradient the backward left, which a gradient defect needs: planted after it, never before."""
    if param.grad is None:
        raise RuntimeError("a gradient defect is planted after the backward: this parameter has no gradient")
    return param.grad
