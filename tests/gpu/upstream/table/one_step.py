"""The one-step checks' entries (load, logits, routing, gradients of one forward and backward), the wide
sweep of every declared family's among them, and the one-device tier's torch kernel bug."""

from __future__ import annotations

import dataclasses

from checks.kinds import Check, Layout

from upstream.entry import KnownBug
from upstream.table.common import (
    LIVE_AT_5_24,
    RUN_ON_2_11_AND_2_13,
    RUN_ON_2_11_WITH_5_24,
    RUN_ON_2_13_ONLY,
    TORCH_2_11_AND_2_13,
    TORCH_2_13_ONLY,
    bisect_to_5_24,
)

_EP_SELECTION = (
    '-k "(test_ep_load_and_logits and qwen3_moe-eager-2-float32) or '
    '(test_ep_gradients and qwen3_moe-batched_mm-2-float32)"'
)
# One selection holds both EP entries' cases; each probe's junit.xml shows both failing or both passing.
_EP_SENTINEL_BISECTED = (
    f"harness bisect --package transformers --good 5.12.1 --bad 5.13.0 -- {_EP_SELECTION}: good and bad give "
    "the same verdict, both fail (exit 2); 2 probes, 347s",
    f"harness bisect --package transformers --good 5.7.0 --bad 5.12.1 -- {_EP_SELECTION}: good and bad give "
    "the same verdict, both fail (exit 2); 2 probes, 275s",
    f"harness bisect --package transformers --good 5.6.2 --bad 5.7.0 -- {_EP_SELECTION}: 5.6.2 untestable "
    "(needs transformers>=5.7.0 for expert-parallel loading), exit 2; 1 probe, 188s",
    "lower end: 5.7.0, the EP floor (first release with an EP plan for qwen3_moe and gpt_oss), fails",
    f"harness bisect --package transformers --good 5.24.0 --bad 5.17.0 -- {_EP_SELECTION}: first good: "
    "transformers 5.18.0 (last bad 5.17.0); 5 probes, 800s",
)

# The families new in 5.24.0: one bisect shows there is nothing earlier to run.
_NEW_IN_5_24 = bisect_to_5_24(
    "5.23.0",
    "(sarvam_moe or lara_mini or inkling2_loop_text or hy_v4_vl_text) and "
    "(test_fsdp_ep_moe or test_ep_load_and_logits)",
    "5.23.0 untestable: pytest collected no tests (no model folders there), exit 2; 1 probe, 45s",
)

_INKLING_MUSE_BISECTED = (
    bisect_to_5_24(
        "5.17.0",
        "inkling_text and test_ep_load_and_logits",
        "first bad: transformers 5.23.0 (last good 5.22.2); 6 probes, 147s",
    ),
    bisect_to_5_24(
        "5.20.0",
        "muse_spark_text and test_ep_load_and_logits",
        "first bad: transformers 5.23.0 (last good 5.22.2); 6 probes, 204s",
    ),
    LIVE_AT_5_24,
)

_INKLING_BARE_ASSERT = KnownBug(
    key="inkling-dtensor-rmsnorm-bare-assert",
    transformers=">=5.23,<5.25",
    torch=TORCH_2_13_ONLY,
    torch_verified=RUN_ON_2_13_ONLY,
    layouts=(Layout.EP,),
    checks=(Check.LOAD, Check.GRADIENTS),
    families=("inkling_text",),
    raises="AssertionError",
    match=r"^\(no message\)$",  # NO_MESSAGE: torch 2.13's _MaskPartial._reduce_value `raise AssertionError`
    raised_at="torch/distributed/tensor/placement_types.py:_reduce_value",
    cause="a DTensor leaves a TP-sharded module and reaches a plain RMSNorm (InklingRMSNorm, "
    "MuseSparkRMSNorm): torch 2.13's DTensor redistribute raises a bare AssertionError in "
    "_MaskPartial._reduce_value (its mask buffer is empty)",
    reproduced="upstream/repros/sharded_load_errors_5_24.py inkling_text|muse_spark_text ep, 5.24.0, "
    "2 CPU ranks, torch 2.13.0: every rank raised at torch/distributed/tensor/placement_types.py:1703 "
    "_reduce_value, from InklingRMSNorm.forward and MuseSparkRMSNorm._norm (re-run 2026-12-02)",
    bisected=(
        _INKLING_MUSE_BISECTED[0],
        "harness bisect --package transformers --good 5.25.0 --bad 5.24.0 -- -k 'test_training_steps and "
        "inkling_text-ep-2': first good: transformers 5.25.0 (last bad 5.24.0); 2 probes, 54s (fixed upstream: the "
        "strict XPASS of 5.25.0's release-day run)",
    ),
)

_WIDE_SWEEP_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="text-config-qk-norm-tp-plan",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=(Layout.EP,),
        checks=(Check.GRADIENTS,),
        # glm4_moe: only its switched config builds q/k norms (Glm4MoeConfig(use_qk_norm=True), default False)
        families=("qwen3_vl_moe_text", "qwen3_omni_moe_text", "glm4_moe+switches"),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*self_attn\.[qk]_norm\.weight",
        cause="the text configs' base_model_tp_plan lacks q_norm/k_norm 'replicated_with_grad_allreduce' (Qwen3-MoE "
        "has it): under EP+TP each rank's q/k norm gradient covers its half of the heads",
        reproduced="upstream/repros/qwen3_vl_omni_ep_qk_norm_gradients.py FAMILY: per-rank q/k norm gradient errors "
        "0.40-1.02 at 5.24.0, on 2 CPU ranks; upstream/repros/glm4_moe_qk_norm_ep_gradients.py: 0.52-0.88 per rank, "
        "their sum over the ranks within 1e-6, 5.24.0",
        bisected=(
            bisect_to_5_24(
                "5.22.2",
                "qwen3_vl_moe_text and test_ep_gradients",
                "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 70s",
            ),
            bisect_to_5_24(
                "5.22.2",
                "qwen3_omni_moe_text and test_ep_gradients",
                "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 69s",
            ),
            "harness bisect --package transformers --good 5.17.0 --bad 5.24.0 -- 'tests/gpu/test_config_switches.py::"
            "test_switches_on_load_logits_and_gradients[glm4_moe+switches-ep-grouped_mm]': first bad: transformers "
            "5.23.0 (last good 5.22.2); 6 probes, 129s",
            LIVE_AT_5_24,
        ),
    ),
    KnownBug(
        key="fsdp-ep-linear-attention-conv1d",
        transformers=">=5.20",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=(Layout.FSDP_EP,),
        checks=(Check.LOAD,),
        families=("bailing_hybrid", "kimi_linear", "glm5_next_text"),
        raises="AssertionError",
        match=r"^load: rank \d+'s FSDP shard of \S*conv1d\.weight is not its share",
        cause="FSDP2+EP loading concatenates the checkpoint's q/k/v conv1d (Concatenate(dim=0)) per shard: each "
        "rank holds [q share | k share | v share], not its share of the whole conv1d",
        reproduced="upstream/repros/fsdp_ep_linear_attention_conv1d.py FAMILY: bailing_hybrid and glm5_next_text "
        "shards equal the concatenated q, k, v shares (largest difference 0.25-0.30), 5.24.0, 2 CPU ranks",
        bisected=(
            bisect_to_5_24(
                "5.20.0",
                "kimi_linear and test_fsdp_ep_moe",
                "good and bad give the same verdict: 5.20.0 fails with the same conv1d message (exit 2)",
            ),
            bisect_to_5_24("5.20.0", "bailing_hybrid and test_fsdp_ep_moe", "the same (exit 2)"),
            bisect_to_5_24("5.20.0", "glm5_next_text and test_fsdp_ep_moe", "the same (exit 2)"),
            "lower end: 5.20.0, the FSDP2+EP floor (tf_adapter), fails",
            LIVE_AT_5_24,
        ),
    ),
    KnownBug(
        key="fsdp-ep-overlapping-meshes",
        transformers=">=5.24",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=(Layout.FSDP_EP,),
        checks=(Check.LOAD,),
        families=("gemma4_text", "diffusion_gemma_text"),
        raises="RuntimeError",
        match=r"Cannot concatenate overlapping meshes",
        cause="FSDP2+EP's fully_shard (transformers/distributed/fsdp.py) concatenates the fsdp mesh with the ep mesh "
        "over the same ranks: the EP plan's TP styles for the dense MLP leave DTensors on the ep mesh",
        reproduced="upstream/repros/sharded_load_errors_5_24.py gemma4_text|diffusion_gemma_text fsdp_ep, 5.24.0, "
        "2 CPU ranks",
        bisected=(
            bisect_to_5_24(
                "5.20.0",
                "gemma4_text and test_fsdp_ep_moe",
                "good and bad give the same verdict (exit 2): 5.20.0 fails otherwise (ValueError: All-reduce "
                "expert parallelism requires `ep_size=tp_size`)",
            ),
            bisect_to_5_24("5.20.0", "diffusion_gemma_text and test_fsdp_ep_moe", "the same (exit 2)"),
            "lower end: not found; only 5.24.0 is verified to fail this way, so a 5.21-5.23 cell shows its own verdict",
            LIVE_AT_5_24,
        ),
    ),
    KnownBug(
        key="sarvam-fused-qkv-split",
        transformers=">=5.24",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=(Layout.EP, Layout.FSDP_EP),
        checks=(Check.LOAD, Check.GRADIENTS),
        families=("sarvam_moe",),
        raises="RuntimeError",
        match=r"issues during automatic conversion of the weights",
        cause="sharded loading splits the checkpoint's fused query_key_value by the targets' full sizes while the "
        "tensor holds one rank's share ('split_sizes to sum exactly to 128 ..., but got [128, 64, 64]')",
        reproduced="upstream/repros/sharded_load_errors_5_24.py sarvam_moe ep|fsdp_ep, 5.24.0, 2 CPU ranks",
        bisected=(
            "lower end: 5.24.0, the first release with sarvam_moe (no model folder in 5.23.0)",
            _NEW_IN_5_24,
            LIVE_AT_5_24,
        ),
    ),
    KnownBug(
        key="fsdp-ep-conversion-on-shard",
        transformers=">=5.24",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=(Layout.FSDP_EP,),
        checks=(Check.LOAD,),
        families=("lara_mini", "inkling2_loop_text"),
        raises="RuntimeError",
        # the first failing rank says one or the other
        match=r"issues during automatic conversion of the weights|You set `ignore_mismatched_sizes` to `False`",
        cause="FSDP2+EP loading runs a checkpoint conversion on an already sharded tensor (lara_mini's fused "
        "in_proj_qkv split by full sizes; inkling2_loop's merged message_input.query [12, 4, 64] for a [6, 4, 64] "
        "shard)",
        reproduced="upstream/repros/sharded_load_errors_5_24.py lara_mini|inkling2_loop_text fsdp_ep, 5.24.0, "
        "2 CPU ranks",
        bisected=(
            "lower end: 5.24.0, the first release with lara_mini and inkling2_loop_text (no model folders in 5.23.0)",
            _NEW_IN_5_24,
            LIVE_AT_5_24,
        ),
    ),
    KnownBug(
        key="dots3-per-layer-qk-rope",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=(Layout.EP,),
        checks=(Check.LOAD, Check.GRADIENTS),
        families=("dots3_note_text",),
        raises="AmbiguousGlobalPerLayerAttributeError",
        match=r"'qk_rope_head_dim' is a per-layer attribute",
        cause="tensor_parallel.transform_output_post_forward reads config.qk_rope_head_dim, a per-layer attribute",
        reproduced="upstream/repros/sharded_load_errors_5_24.py dots3_note_text ep, 5.24.0, 2 CPU ranks",
        bisected=(
            bisect_to_5_24(
                "5.23.0",
                "dots3_note_text and test_ep_load_and_logits",
                "good and bad give the same verdict: 5.23.0 fails the same way (exit 2); 2 probes, 49s",
            ),
            "lower end: 5.23.0, the first release declaring EP for dots3_note_text, fails",
            LIVE_AT_5_24,
        ),
    ),
    KnownBug(
        key="glm5-next-o-proj-rowwise",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=(Layout.EP,),
        checks=(Check.LOAD, Check.GRADIENTS),
        families=("glm5_next_text",),
        raises="RuntimeError",
        match=r"mat1 and mat2 shapes cannot be multiplied|shape '\[\d+, \d+\]' is invalid for input of size \d+",
        cause="the TP plan's 'layers.*.self_attn.o_proj: rowwise' also matches the linear-attention layers' o_proj, "
        "whose input is not column-sharded",
        reproduced="upstream/repros/sharded_load_errors_5_24.py glm5_next_text ep, 5.24.0, 2 CPU ranks",
        bisected=(
            bisect_to_5_24(
                "5.17.0",
                "glm5_next_text and test_ep_load_and_logits",
                "first bad: transformers 5.23.0 (last good 5.22.2); 6 probes, 660s",
            ),
            LIVE_AT_5_24,
        ),
    ),
    _INKLING_BARE_ASSERT,
    # the same bare assert for muse_spark_text, which raises it on torch 2.11 too (inkling_text: the entry below)
    dataclasses.replace(
        _INKLING_BARE_ASSERT,
        key="muse-spark-dtensor-rmsnorm-bare-assert",
        families=("muse_spark_text",),
        transformers=">=5.23",  # live: 5.25.0 fixed inkling_text's, not this one
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        bisected=_INKLING_MUSE_BISECTED,
    ),
    KnownBug(
        key="inkling-dtensor-rmsnorm-mixed",
        transformers=">=5.23,<5.25",
        torch=">=2.11,<2.13",  # torch 2.13.0 raises the bare AssertionError of the entry above instead
        torch_verified="2.11.0 only: the GPU host's CPU, transformers 5.24.0, gloo: both inkling_text EP cases "
        "failed with this message, 2026-12-02 (muse_spark_text raised the bare AssertionError there, as on 2.13)",
        layouts=(Layout.EP,),
        checks=(Check.LOAD, Check.GRADIENTS),
        families=("inkling_text",),
        raises="RuntimeError",
        # torch's C++ DTensor dispatch says "aten.mul.Tensor got mixed ...", its Python one "aten.mul.Tensor: got ..."
        match=r"^aten\.mul\.Tensor:? got mixed torch\.Tensor and DTensor",
        cause="a DTensor leaves a TP-sharded module and reaches a plain RMSNorm (InklingRMSNorm): on torch 2.11 "
        "the norm's weight times the DTensor hidden states is refused as mixed torch.Tensor and DTensor",
        reproduced="the suite on torch 2.11.0 with transformers 5.24.0 (the GPU host's CPU, 2 gloo ranks, "
        "2026-12-02): test_ep_load_and_logits and test_ep_gradients[inkling_text-grouped_mm-2-float32]; the mixed "
        "multiply alone raises it on torch 2.11.0 (the GPU image, 1 gloo rank)",
        bisected=(
            "lower end: 5.23.0, where the torch 2.13.0 bisects of the entry above find these families first fail "
            "(EP shards their dense weights with the TP plan from there); not bisected on torch 2.11",
            "upper end: 5.25.0 passes on torch 2.11.0 (the strict XPASS of the release-day replay on the GPU host's "
            "CPU, 2026-12-06), as the torch 2.13.0 twin above, whose bisect found it first good; not bisected on "
            "torch 2.11",
        ),
    ),
    KnownBug(
        key="ep-without-tp-plan",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=(Layout.EP,),
        checks=(Check.LOAD, Check.GRADIENTS),
        families=("openai_privacy_filter", "zaya"),
        raises="ValueError",
        match=r"has no `tp_plan`",
        cause="the config declares an EP plan but no TP plan, and from 5.23 EP beside replicated dense weights is "
        "refused: EP cannot be used at all",
        reproduced="upstream/repros/sharded_load_errors_5_24.py openai_privacy_filter ep, 5.24.0, 2 CPU ranks; "
        "upstream/repros/zaya_ep_without_tp_plan.py (ep_size=2 with tp_size=2 raises this; alone, `ep_size` must "
        "divide `fsdp_size * tp_size`), 5.24.0, 2 CPU ranks",
        bisected=(
            bisect_to_5_24(
                "5.7.0",
                "openai_privacy_filter and test_ep_load_and_logits",
                "first bad: transformers 5.23.0 (last good 5.22.2); 7 probes, 263s",
            ),
            bisect_to_5_24("5.22.2", "test_training_steps and zaya-ep-2",
                    "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 71s"),
            LIVE_AT_5_24,
        ),
    ),
)



_ONE_STEP_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="ep-eager-sentinel-one-hot",
        transformers=">=5.7,<5.18",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_AND_2_13,
        layouts=(Layout.EP,),
        checks=(Check.LOGITS, Check.GRADIENTS),
        implementations=("eager",),
        raises="RuntimeError",
        match=r"Class values must be smaller than num_classes",
        cause="eager experts one-hot the EP router's sentinel expert id: 'Class values must be smaller than "
        "num_classes'",
        reproduced="upstream/repros/ep_experts_implementations_sentinel.py eager: raises at 5.7.0 and 5.17.0, "
        "not at 5.18.0, on 2 CPU ranks",
        bisected=_EP_SENTINEL_BISECTED,
    ),
    KnownBug(
        key="ep-batched-mm-router-gradient",
        transformers=">=5.7,<5.18",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_AND_2_13,
        layouts=(Layout.EP,),
        checks=(Check.GRADIENTS,),
        implementations=("batched_mm",),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*\.(gate|router)\.weight",  # the router's gradient
        cause="batched_mm experts under EP give the router a wrong gradient (relative error 0.5-1.1)",
        reproduced="upstream/repros/ep_experts_implementations_sentinel.py batched_mm: router gradient error 0.6-0.8 "
        "at 5.7.0, 1.11 at 5.17.0, 0 at 5.18.0, on 2 CPU ranks",
        bisected=_EP_SENTINEL_BISECTED,
    ),
    KnownBug(
        key="gpt-oss-eager-sentinel-5-18",
        transformers=">=5.18,<5.19",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=(Layout.EP,),
        checks=(Check.LOGITS, Check.GRADIENTS),
        families=("gpt_oss",),
        implementations=("eager",),
        raises="RuntimeError",
        match=r"Class values must be smaller than num_classes",
        cause="GPT-OSS eager experts still one-hot the EP sentinel expert id one release after the other "
        "families' fix (at inference and in training): 'Class values must be smaller than num_classes'",
        reproduced="upstream/repros/gpt_oss_eager_ep_one_hot.py: raises at 5.18.0, not at 5.19.0 or 5.20.0, on 2 "
        "CPU ranks",
        bisected=(
            'harness bisect --package transformers --good 5.18.0 --bad 5.17.0 -- -k "(test_ep_load_and_logits and '
            'eager-2-float32) or (test_ep_gradients and batched_mm-2-float32)": both fail (exit 2); at 5.17.0 every '
            "family's eager logits and batched_mm gradients fail, at 5.18.0 only gpt_oss's eager logits; 2 probes, "
            "291s",
            "lower end: 5.18.0, where the entry above (the same failure for every family) ends",
            'harness bisect --package transformers --good 5.20.0 --bad 5.18.0 -- -k "test_ep_load_and_logits and '
            'gpt_oss-eager-2-float32": first good: transformers 5.19.0 (last bad 5.18.0); 3 probes, 205s',
            'harness bisect --package transformers --good 5.19.0 --bad 5.18.0 -- -k "test_ep_gradients and '
            'gpt_oss-eager-2-float32": first good: transformers 5.19.0 (last bad 5.18.0); 2 probes, 81s',
        ),
    ),
    KnownBug(
        key="fsdp-ep-half-expert-gradients",
        transformers=">=5.20,<5.23",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=(Layout.FSDP_EP,),
        checks=(Check.GRADIENTS,),
        raises="AssertionError",
        match=r"^gradients differ from the whole model's: .*\(0\.5 times the whole model's gradient\)",
        cause="FSDP2 + EP expert gradients (and expert biases) are exactly 0.5x the whole model's on 2 ranks",
        reproduced="upstream/repros/fsdp_ep_expert_gradients_halved.py: ratio 0.5 at 5.20.0 and 5.22.2, 1.0 at "
        "5.23.0 and 5.24.0, on 2 CPU ranks",
        bisected=(
            'harness bisect --package transformers --good 5.19.0 --bad 5.20.0 -- -k "test_fsdp_ep_moe and '
            'qwen3_moe-2-float32": 5.19.0 untestable (needs transformers>=5.20.0 for FSDP2 with expert '
            "parallelism), exit 2; 1 probe, 169s",
            "lower end: 5.20.0, the FSDP2 + EP floor (tf_adapter), fails (the upper bisect's bad end)",
            'harness bisect --package transformers --good 5.24.0 --bad 5.20.0 -- -k "test_fsdp_ep_moe and '
            'qwen3_moe-2-float32": first good: transformers 5.23.0 (last bad 5.22.2); 6 probes, 806s',
        ),
    ),
    KnownBug(
        key="gpt-oss-eager-sentinel-all-reduce-ep",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24,
        layouts=(Layout.EP,),
        checks=(Check.LOGITS,),
        families=("gpt_oss",),
        implementations=("eager",),
        raises="RuntimeError",
        match=r"Class values must be smaller than num_classes",
        cause="GPT-OSS eager experts one-hot the EP sentinel expert id at inference (AllReduceEP): "
        "'Class values must be smaller than num_classes'",
        reproduced="upstream/repros/gpt_oss_eager_ep_one_hot.py: raises at 5.23.0 and 5.24.0, not at 5.22.2, "
        "on 2 CPU ranks",
        bisected=(
            'harness bisect --package transformers --good 5.20.0 --bad 5.24.0 -- -k "test_ep_load_and_logits and '
            'gpt_oss-eager-2-float32": first bad: transformers 5.23.0 (last good 5.22.2); 6 probes, 493s',
            "upper end: none, the bug is live; 5.24.0, the newest release when it was bisected, still fails (the "
            "gptoss bisect's bad end)",
        ),
    ),
    # Found by the wide sweep of every declared family (issue 21). Bisected on torch 2.13.0 CPU, 2 gloo ranks,
    # fp32, `--env-dir` shared; the EP ones all start at 5.23.0, where EP of a family must shard its dense
    # weights with the family's TP plan (tf_adapter.FIRST_REFUSING_REPLICATED_DENSE_EP), so each TP plan is applied.
    *_WIDE_SWEEP_BUGS,
    # Found by the one-device tier on the H200 (issue 29): a torch kernel bug that only a GPU shows.
    KnownBug(
        key="deepseek-v3-cuda-sdpa-offset",
        transformers=None,  # torch's bug: every transformers release that reaches the kernel shows it
        torch=">=2.11",
        torch_verified="2.11.0+cu130 only (the H200 image, cuDNN 9.19); not bisected in torch: the bug needs CUDA, "
        "and the GPU host has this one CUDA torch, no network, and a run carries at most 64 MiB (a CUDA torch wheel "
        "is GBs)",
        layouts=(Layout.ONE_DEVICE,),  # device_cases.LAYOUT
        checks=(Check.LOGITS,),
        families=("deepseek_v3",),
        dtypes=("bfloat16",),
        devices=("cuda",),
        raises="AssertionError",
        match=r"^logits differ from the whole model's: \d+ of \d+ values farther than",
        cause="CUDA scaled_dot_product_attention takes a bfloat16 value view whose storage offset is not 16-byte "
        "aligned (MLA splits keys and values out of one projection; qk_nope_head_dim 4): torch's own choice, cuDNN "
        "attention, returns wrong rows, and flash and memory-efficient attention raise 'CUDA error: misaligned "
        "address'",
        reproduced="upstream/repros/cuda_sdpa_misaligned_value.py on the H200, torch 2.11.0+cu130: default "
        "(cuDNN) max error 4.27, MATH 0.00628, the value made contiguous 0.00628, float32 right with every kernel "
        "(2026-12-03); in the suite 171 of 16384 logits off by up to 0.71 against a bound of 0.311",
        bisected=(
            "lower end: 5.17.0, the oldest release of the matrices (the GPU image's), fails so; the bug is torch's, "
            "so no transformers bisect was run",
            "upper end: none, the bug is live (5.24.0, the newest release then, carried to the GPU host, fails so)",
        ),
    ),
)

ENTRIES: tuple[KnownBug, ...] = _ONE_STEP_BUGS
