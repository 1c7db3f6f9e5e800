"""The releases before 5.17.0 that the EP layout reaches (from its floor, 5.7.0, and each early family's first
EP plan): what the wide EP training case meets there."""

from __future__ import annotations

from checks.kinds import Check, Layout

from upstream.entry import KnownBug
from upstream.table.common import RUN_ON_2_13_ONLY, TORCH_2_13_ONLY

# ---------------------------------------------------------------- below the EP layout's floor (families.EARLY_EP)
# The families whose configs declare an EP plan before 5.7.0 (ep_plan_history.json), run from that release: what the
# wide EP training case `test_training_steps[<family>-ep-2-float32-wide]` (grouped_mm) meets at 5.6.0-5.16.1, torch
# 2.13.0 CPU, 2 gloo ranks, fp32. `harness bisect` reads a probe's verdict, not its message: where one failing range
# holds two failures, the release between them comes from `harness run` of each release (the index has no release
# between 5.7.0 and 5.8.0). gemma4_text's 5.6-5.15 gradients were read with the gradient check taking a rank's
# plain-tensor TP shard as check_load does (rank_cases.tp_chunk; not in the suite yet: without it those releases stop
# at `gradient of model.layers.0.mlp.gate_proj.weight has shape (64, 64), the whole model's (128, 64)`).
_EARLY_BISECT = "harness bisect --package transformers --good 5.17.0 --bad {bad} -- -k 'test_training_steps and {case}'"
_EARLY_RUN = ("harness run --matrix M -- -k 'test_training_steps and {case}' (M: cpu, 2 ranks, torch 2.13.0, "
              "transformers {releases})")
_EARLY_RELEASE_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="opf-router-gradients-early",
        transformers=">=5.6,<5.17",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=(Layout.EP,),
        checks=(Check.GRADIENTS,),
        families=("openai_privacy_filter",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*mlp\.router\.(weight|bias) \d",
        cause="under the EP plan every gradient is wrong, the router's the most (relative error 0.6-0.85), the logits "
        "right: each rank's router and dense gradients keep only its own experts' share",
        reproduced="upstream/repros/openai_privacy_filter_ep_gradients.py: router.weight gradient error 0.835 / "
        "0.454 (rank 0 / 1), 52 of 53 parameters above 1e-4, logits within 1e-6, at 5.6.0 and 5.8.0; 0.0022 at 5.17.0 "
        "(largest 0.0046), on 2 CPU ranks",
        bisected=(
            "lower end: 5.6.0, the family's first EP plan (ep_plan_history.json), fails so (the bisect's bad end; "
            "5.6.1 and 5.6.2 too, harness run)",
            _EARLY_BISECT.format(bad="5.6.0", case="openai_privacy_filter-ep-2")
            + ": first good: transformers 5.17.0 (last bad 5.16.1); 7 probes, 4 environments built, 240s",
        ),
    ),
    KnownBug(
        key="opf-expert-bias-nan-early",
        transformers=">=5.8,<5.17",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=(Layout.EP,),
        checks=(Check.GRADIENTS,),
        families=("openai_privacy_filter",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*mlp\.experts\.gate_up_proj_bias (nan|\S+e\+\d+) ",
        cause="under the EP plan the experts' gate_up_proj_bias gradient is memory never written (NaN, or 1e+03 to "
        "1e+35), besides the wrong gradients of the entry above",
        reproduced="upstream/repros/openai_privacy_filter_ep_gradients.py: the largest gradient error 1.67e+07 "
        "(layers.2.mlp.experts.gate_up_proj_bias) at 5.8.0, 2.17 (a router) at 5.6.0, on 2 CPU ranks",
        bisected=(
            "lower end: " + _EARLY_RUN.format(case="openai_privacy_filter-ep-2", releases="5.7.0 and 5.8.0")
            + ": 5.7.0 fails with the routers first (the entry above), 5.8.0 with layers.2.mlp.experts."
            "gate_up_proj_bias 9.58e+15; no release between them; 5.9.0-5.16.1 fail with the bias NaN",
            _EARLY_BISECT.format(bad="5.6.0", case="openai_privacy_filter-ep-2")
            + ": first good: transformers 5.17.0 (last bad 5.16.1, bias NaN); 7 probes, 240s",
        ),
    ),
    KnownBug(
        key="gemma4-router-gradients-early",
        transformers=">=5.6,<5.17",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=(Layout.EP,),
        checks=(Check.GRADIENTS,),
        families=("gemma4_text",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*\.router\.(per_expert_scale|proj\.weight|scale) \d",
        cause="under the EP plan the router's gradients are wrong (per_expert_scale 0.607, proj.weight 0.497), 63 of "
        "78 parameters' with them, the logits right",
        reproduced="upstream/repros/ep_before_5_7.py gemma4_text: largest gradient error 0.949, a router, at 5.6.0 "
        "and 5.7.0, on 2 CPU ranks; the suite's case the same at 5.6.0-5.7.0 and 5.16.0-5.16.1",
        bisected=(
            "lower end: 5.6.0, the family's first EP plan, fails so: "
            + _EARLY_RUN.format(case="gemma4_text-ep-2", releases="5.6.0, 5.6.1, 5.6.2, 5.7.0")
            + ", with the gradient check reading plain TP shards",
            _EARLY_BISECT.format(bad="5.16.0", case="gemma4_text-ep-2")
            + ": first good: transformers 5.17.0 (last bad 5.16.1); 3 probes, 45s",
        ),
    ),
    KnownBug(
        key="gemma4-nan-backward-early",
        transformers=">=5.8,<5.16",  # 5.16.0 fails without NaN (the router entry above)
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=(Layout.EP,),
        checks=(Check.GRADIENTS,),
        families=("gemma4_text",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: \d+ of \d+ parameters exceed their bound .*: "
        r"model\.per_layer_\S+ nan ",  # the NaN starts at gemma4's per-layer projection
        cause="under the EP plan the backward turns NaN (model.per_layer_projection_norm.weight, attention weights): "
        "the NaN gradients of openai_privacy_filter's entry above, from the same release",
        reproduced="the suite's case with the gradient check reading plain TP shards: 63 of 78 gradients NaN or off at "
        "5.8.0, 5.10.1, 5.13.0 and 5.15.0; 5.6.0-5.7.0 without NaN (the router entry above), on 2 CPU ranks",
        bisected=(
            "lower end: " + _EARLY_RUN.format(case="gemma4_text-ep-2", releases="5.7.0 and 5.8.0")
            + ", with the gradient check reading plain TP shards: 5.7.0 fails without NaN, 5.8.0 with; no release "
            "between them",
            "upper end: 5.15.0, the newest release run with that gradient check, fails so; 5.16.0 fails without NaN "
            "(the router entry above); 5.15.1 not run",
        ),
    ),
)

ENTRIES: tuple[KnownBug, ...] = _EARLY_RELEASE_BUGS
