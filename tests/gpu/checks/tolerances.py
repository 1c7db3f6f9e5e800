"""Every tolerance of the suite, in one place, with the reason for its size.

A sharded model and the whole model run the same arithmetic in a different order (experts see their
tokens grouped differently, collectives sum partial results, FSDP averages gradients across ranks), so
they agree to rounding, not bit for bit. How much rounding moves a quantity depends on the machine (a CPU's
kernels, a GPU's), the family (a parameter whose gradient cancels is far noisier than one that sums) and the
dtype, so no constant measured on one machine bounds it on another. The bounds are measured in the run itself:

1. The ground truth is the whole model in float64, holding exactly the case dtype's weights (the whole model
   cast up, so nothing but the arithmetic differs; where a modeling file casts to float32 on purpose it stays
   float64: loading/float64_mode.py).
2. The whole model in the case's dtype, on this machine, with its kernels, shows how far rounding alone moves
   each quantity from that truth: its own error, per parameter and for the logits. For gradients it is sampled
   twice, and the larger counts: as it is, and again with the batch's sequences reversed and every leaf module's
   output moved by up to one unit in the last place (rank_cases.gradients_in_another_order). One sample can be
   lucky: a gradient that cancels (DeepSeek-V4's and HY-V4's hyper-connection scales) moves 1.5e-5..5.4e-4 with
   the summation order alone, and under ATEN_CPU_CAPABILITY=default the first sample of hy_v4_vl_text's
   hc_head.hc_scale read 5.7e-5 where the sharded model's was 1.1e-3 (20x); the second read 5.9e-4.
3. The sharded model's error against the same truth must stay within FACTOR times that error, or within
   FACTOR times a floor of FLOOR_ULPS units in the last place of the dtype, whichever is larger (a gradient
   that happens to be exactly representable must not make the bound tighter than rounding can keep).

This is the shape of PyTorch inductor's accuracy check (torch/_dynamo/utils.py, `same()` with an fp64
reference: the result may be at most a small multiple farther from float64 than eager, plus a floor), applied
norm-wise per parameter. The sharded arithmetic is rounding of the same kind and depth as the whole model's (a
few more additions where collectives sum partial results), so its error sits at about the whole model's; a real
defect (a lost term, a wrong shard, a gradient scaled by 1%) is orders of magnitude above it in float32.

FACTOR and FLOOR_ULPS were chosen by measurement (checks/noise_table.py prints the worst ratio of error to bound per
dtype from a run's JUnit): see the numbers beside them.
"""

from __future__ import annotations

import math

import torch

# The ground truth's dtype.
REFERENCE_DTYPE = torch.float64

# The sharded model may be at most this many times farther from float64 than the whole model is. Measured on the
# cases of correct runs, the worst ratio of the sharded error to max(whole error, floor), per parameter:
#   float32 gradients: 2.60 native (AVX-512 Xeon), 3.08 under ATEN_CPU_CAPABILITY=avx2, 2.48 under =default
#     (torch 2.13.0, transformers 5.24.0, 2 gloo ranks; HY-V4's hyper-connection parameters the worst); 3.80 with
#     one sample on the GPU host's CPU (torch 2.11, 8 gloo ranks, worlds 2-8); 1.0 on the H200 (one-device cases)
#   bfloat16 gradients: 0.77 (the floor of 4 ulps dominates); logits: 1.30 float32, 0.32 bfloat16
# FACTOR leaves 2.5x over the worst float32 ratio for kernels not measured yet, and keeps a 1% error in float32
# (1e-2 against bounds of about 1e-5) more than 100x over its bound (test_planted_bugs.py asserts it).
FACTOR = {"float32": 8.0, "bfloat16": 4.0}
# The floor, in units in the last place of the dtype (relative): a gradient the whole model computes exactly,
# or luckily close, still gets the room a few roundings need.
FLOOR_ULPS = 4


def ulp(dtype_name: str) -> float:
    """The dtype's machine epsilon (the spacing of numbers at 1)."""
    try:
        return torch.finfo(getattr(torch, dtype_name)).eps
    except (AttributeError, TypeError):
        raise ValueError(f"no rounding model for dtype {dtype_name!r}; known: {sorted(FACTOR)}") from None


def factor(dtype_name: str) -> float:
    try:
        return FACTOR[dtype_name]
    except KeyError:
        raise ValueError(f"no bound factor for dtype {dtype_name!r}; known: {sorted(FACTOR)}") from None


def gradient_bound(dtype_name: str, whole_error: float) -> float:
    """The largest relative error (L2 norm over the parameter, against float64) the sharded model's gradient may
    have, given the whole model's own relative error for that parameter on this machine."""
    noise = whole_error if math.isfinite(whole_error) else 0.0  # a whole model that fails has no noise to lend
    return factor(dtype_name) * max(noise, FLOOR_ULPS * ulp(dtype_name))


def logits_bound(dtype_name: str, whole_difference: float, reference_scale: float) -> float:
    """The largest |sharded - float64| a logit may have, given the whole model's largest |whole - float64| and
    the largest |logit| of the reference (the floor is relative to the logits' size)."""
    noise = whole_difference if math.isfinite(whole_difference) else 0.0
    return factor(dtype_name) * max(noise, FLOOR_ULPS * ulp(dtype_name) * reference_scale)


# The MoE router is built to decide clearly (see models/tiny_models.py): in every layer, each token's two
# chosen experts score more than this above the third, so no dtype's rounding can flip a route ...
ROUTING_MARGIN_MIN = 2.0
# ... and the top expert's share of the chosen experts' routing weights stays well under 1, so gradients still
# flow through the router (a share: routed scaling factors of 1.5-2.5 multiply both weights alike).
TOP_WEIGHT_RANGE = (0.45, 0.8)

# Fake-quantized weights are compared exactly (rank_cases.check_quantized_weights): each expert's (or
# matrix's) quantization depends on that expert alone, so the sharded and whole models must produce the
# same bits. Any difference means a scale covered something else, such as a rank's local shard.

# Training (training/steps.py): from its second step a run computes on parameters that its own earlier rounding already
# moved, so the sharded run and the whole runs part further with every step, each by its own path. Two samples of
# the whole run do not bound a third path after steps that compound: under ATEN_CPU_CAPABILITY=default (torch
# 2.13.0, transformers 5.24.0, 2 gloo ranks) the worst ratios of error to bound were 2.2 (hy_v4_vl_text, EP, a
# hyper-connection scale after step 3, float32) and 1.13 (qwen3_moe, FSDP2+EP, a k_proj gradient at step 2,
# bfloat16), against 0.91 at most natively and under avx2. From step 2 the bounds are this many times wider: the
# worst ratio then 0.55, while a resume that loads stale optimizer state stays 1000x over its bound at step 3 and
# the accumulation bug's q/k norm gradients 1e5x over theirs at step 1 (where no widening applies).
TRAINING_COMPOUNDING = 4.0


def training_widening(step: int) -> float:
    """How much wider a training step's bounds are than a single step's (1 at the first step)."""
    return 1.0 if step <= 1 else TRAINING_COMPOUNDING
