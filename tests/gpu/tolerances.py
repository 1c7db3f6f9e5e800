"""Every tolerance of the suite, in one place, with the reason for its size.

A sharded model and the whole model run the same arithmetic in a different order (experts see their
tokens grouped differently, collectives sum partial results, FSDP averages gradients across ranks), so
they agree to rounding, not bit for bit. The bounds below sit well above that rounding for each dtype
and well below what a real defect produces (a wrong shard, a lost gradient term, a flipped route).
"""

from __future__ import annotations

# How each bound below was measured: the worst error of correct runs of every family x experts implementation x
# layout the suite runs, from the JUnit properties the cases record, printed per group by
#     python -m pytest tests/gpu --junitxml=junit.xml -o junit_family=xunit1
#     python tests/gpu/noise_table.py junit.xml
# on 2 gloo CPU ranks (the whole suite, 141 cases) and 4 (the EP cases, HARNESS_CPU_RANKS=4 ... -k "4-float32 or
# 4-bfloat16", 70 cases), torch 2.13.0, transformers 5.24.0, 2026-12-01; the worst of both runs. A bound is a
# stated multiple of that worst error: 30x in float32 (room for GPU kernels' other summation orders: CUDA runs
# use TF32 off), 5x in bfloat16, whose rounding already sits within a factor 10 of a real defect's size.
# Not yet measured on GPUs: run the same two commands on a GPU cell and raise MEASURED_WORST if it is larger.

# Largest relative gradient error allowed, per parameter: |g - g_whole| / |g_whole| (L2 norms over the whole
# parameter, after gathering its shards). A norm-wise error is immune to the near-zero entries that make
# element-wise ratios meaningless. A missing or doubled term (one rank's tokens, one expert, a gradient divided
# twice) gives 1e-1 or more, so anything 1,000x above float32's rounding fails.
#   float32:  worst 9.51e-7 (gpt_oss, ep, batched_mm); 30x -> 2.85e-5
#   bfloat16: worst 2.02e-2 (gpt_oss, ep, 4 ranks, every implementation: the small norm weights, whose gradients
#             sum over every token); 5x -> 0.101
MEASURED_WORST = {
    ("float32", "gradients"): 9.51e-7,
    ("bfloat16", "gradients"): 2.02e-2,
    ("float32", "logits"): 9.54e-7,
    ("bfloat16", "logits"): 1.56e-2,
}
FACTOR = {"float32": 30, "bfloat16": 5}
GRAD_REL_ERROR_BOUND = {dtype: FACTOR[dtype] * MEASURED_WORST[(dtype, "gradients")] for dtype in FACTOR}

# Logits of the sharded model against the whole model's: |a - b| <= atol + rtol * |b|, element-wise (logits
# of this suite's models are of order 1, so an absolute bound is enough).
#   float32:  worst 9.54e-7 (qwen3_moe, ep, batched_mm, 4 ranks); 30x -> 2.86e-5
#   bfloat16: worst 1.56e-2, two bfloat16 steps at logits of 2-4 (qwen3_moe, mixtral, deepseek_v3, ep); 5x -> 0.078
LOGITS_TOLERANCE = {dtype: {"atol": FACTOR[dtype] * MEASURED_WORST[(dtype, "logits")], "rtol": 0.0} for dtype in FACTOR}

# The MoE router is built to decide clearly (see tiny_models.py): in every layer, each token's two
# chosen experts score more than this above the third, so no dtype's rounding can flip a route ...
ROUTING_MARGIN_MIN = 2.0
# ... and the top expert's share of the chosen experts' routing weights stays well under 1, so gradients still
# flow through the router (a share: routed scaling factors of 1.5-2.5 multiply both weights alike).
TOP_WEIGHT_RANGE = (0.45, 0.8)

# Fake-quantized weights are compared exactly (rank_cases.check_quantized_weights): each expert's (or
# matrix's) quantization depends on that expert alone, so the sharded and whole models must produce the
# same bits. Any difference means a scale covered something else, such as a rank's local shard.


def logits_tolerance(dtype_name: str) -> dict[str, float]:
    try:
        return LOGITS_TOLERANCE[dtype_name]
    except KeyError:
        raise ValueError(f"no logits tolerance for dtype {dtype_name!r}; known: {sorted(LOGITS_TOLERANCE)}") from None


def noisy_parameter_bound(dtype_name: str, noise_floor: float) -> float:
    """A parameter whose float32 gradient moves by `noise_floor` (relative) when only the whole model's summation
    order changes (families.NOISY_PARAMETERS, measured there): the same stated factor over its own noise, never
    tighter than the dtype's bound."""
    return max(grad_error_bound(dtype_name), FACTOR[dtype_name] * noise_floor)


def grad_error_bound(dtype_name: str) -> float:
    try:
        return GRAD_REL_ERROR_BOUND[dtype_name]
    except KeyError:
        raise ValueError(f"no gradient bound for dtype {dtype_name!r}; known: {sorted(GRAD_REL_ERROR_BOUND)}") from None
