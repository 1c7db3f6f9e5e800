"""Every tolerance of the suite, in one place, with the reason for its size.

A sharded model and the whole model run the same arithmetic in a different order (experts see their
tokens grouped differently, collectives sum partial results, FSDP averages gradients across ranks), so
they agree to rounding, not bit for bit. The bounds below sit well above that rounding for each dtype
and well below what a real defect produces (a wrong shard, a lost gradient term, a flipped route).
"""

from __future__ import annotations

# Largest relative gradient error allowed, per parameter: |g - g_whole| / |g_whole| (L2 norms over the
# whole parameter, after gathering its shards). A norm-wise error is immune to the near-zero entries that
# make element-wise ratios meaningless. Rounding gives below 1e-6 in float32 and up to about 1e-2 in
# bfloat16 (measured on CPU and H200: the worst are the small norm weights, whose gradients sum over every
# token); a missing or doubled term (one rank's tokens, one expert, a gradient divided twice) gives 1e-1
# or more.
GRAD_REL_ERROR_BOUND = 3e-2

# Logits of the sharded model against the whole model's: |a - b| <= atol + rtol * |b|, element-wise.
# float32 keeps about 7 digits, so only the summation order differs. bfloat16 keeps 8 bits of mantissa
# (relative step 2**-8 = 0.004) and rounds after every layer; two layers of it stay within a few steps
# of logits of order 1.
LOGITS_TOLERANCE = {
    "float32": {"atol": 1e-4, "rtol": 1e-4},
    "bfloat16": {"atol": 3e-2, "rtol": 3e-2},
}

# The MoE router is built to decide clearly (see tiny_models.py): in every layer, each token's two
# chosen experts score more than this above the third, so no dtype's rounding can flip a route ...
ROUTING_MARGIN_MIN = 2.0
# ... and the top expert's routing weight stays well under 1, so gradients still flow through the router.
TOP_WEIGHT_RANGE = (0.45, 0.65)

# Fake-quantized weights are compared exactly (rank_cases.check_quantized_weights): each expert's (or
# matrix's) quantization depends on that expert alone, so the sharded and whole models must produce the
# same bits. Any difference means a scale covered something else, such as a rank's local shard.


def logits_tolerance(dtype_name: str) -> dict[str, float]:
    try:
        return LOGITS_TOLERANCE[dtype_name]
    except KeyError:
        raise ValueError(f"no logits tolerance for dtype {dtype_name!r}; known: {sorted(LOGITS_TOLERANCE)}") from None
