"""What transformers 5.25.0 changed, found by the suite on its release day."""

from __future__ import annotations

from checks.kinds import Check, Layout

from upstream.entry import KnownBug
from upstream.table.common import TORCH_2_11_AND_2_13

# ---------------------------------------------------------------- new in transformers 5.25.0
# What 5.25.0 changed, found by the suite on its release day (torch 2.13.0 CPU, 2 gloo ranks, fp32): each the only
# red of its case once the table's ranges stayed open. Each bisect ran with HARNESS_INSTALLER=pip and a shared
# --env-dir; the reproducers were written by `harness repro TEST_ID` and run alone (torch and transformers only).
_BISECT_5_25 = "harness bisect --package transformers --good 5.24.0 --bad 5.25.0 -- -k '{selection}': {answer}"
_FIRST_BAD_5_25 = "first bad: transformers 5.25.0 (last good 5.24.0); 2 probes, {seconds}s"
_NO_FOLDER_5_24 = "5.24.0 untestable: pytest collected no tests (no model folder there), exit 2; 1 probe, 14s"
_REPRO_5_25 = ("`harness repro 'tests/gpu/test_training.py::test_training_steps[{case}]'`, the script run alone (torch "
               "2.13.0 CPU, 2 gloo ranks, 5.25.0): exit 1, {what}")
_LIVE_AT_5_25 = "upper end: none, the bug is live (5.25.0, the newest release, fails so)"
RUN_ON_2_11_WITH_5_25 = (
    "2.13.0 (the bisects) and 2.11.0 (the GPU host's CPU, transformers 5.25.0, gloo, the release-day replay of "
    "2026-12-06: every covered case red before the entry existed, those read with this entry's type and message)"
)
_NEW_IN_5_25_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="grad-allreduce-training-new-tp-plans",
        transformers=">=5.25",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_25,
        layouts=(Layout.EP,),
        checks=(Check.TRAIN,),
        families=("afmoe", "hunyuan_v1_moe", "lfm2_moe"),
        raises="AssertionError",
        match=r"^step 1: gradients differ from the whole model's: .*self_attn\.(?:[qk]_norm|query_layernorm|"
        r"key_layernorm|[qk]_layernorm)\.weight .*\(accumulated over 2 micro-batches\)$",
        cause="5.25.0 gives these families attention TP plans whose q/k norms are 'replicated_with_grad_allreduce' "
        "(5.24.0 had only expert TP styles), so the accumulation bug of replicated-grad-allreduce-training reaches "
        "them: the post-accumulate-grad all-reduce sums the whole accumulated q/k norm gradient again",
        reproduced=_REPRO_5_25.format(
            case="afmoe-ep-2-float32-wide",
            what="rank 0 'step 1: gradients differ ...: model.layers.1.self_attn.k_norm.weight 0.599 (its bound "
            "5.43e-06) ...', the one-backward gradient check before it within its bound; in the suite hunyuan_v1_moe "
            "(query_layernorm, key_layernorm: 0.53-0.56) and lfm2_moe (q_layernorm, k_layernorm: 0.63-0.69) fail so",
        ),
        bisected=(
            _BISECT_5_25.format(selection="test_training_steps and afmoe-ep-2",
                                answer=_FIRST_BAD_5_25.format(seconds=133)),
            _BISECT_5_25.format(selection="test_training_steps and hunyuan_v1_moe-ep-2",
                                answer=_FIRST_BAD_5_25.format(seconds=57)),
            _BISECT_5_25.format(selection="test_training_steps and lfm2_moe-ep-2",
                                answer=_FIRST_BAD_5_25.format(seconds=67)),
            _LIVE_AT_5_25,
        ),
    ),
    KnownBug(
        key="dots3-vision-tp-plan-dropped",
        transformers=">=5.25",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_25,
        layouts=(Layout.EP,),
        checks=(Check.LOAD, Check.GRADIENTS),
        families=("dots3_note_vision_encoder",),
        raises="ValueError",
        match=r"has no `tp_plan`",
        cause="5.25.0 drops every 'moe_tp_experts' style from the TP plans, which leaves Dots3NoteVisionConfig's "
        "base_model_tp_plan empty while its EP plan stays: EP beside replicated dense weights is refused (from "
        "5.23), so the vision encoder that loaded expert-parallel at 5.24.0 cannot at all",
        reproduced="upstream/repros/dots3_vision_ep_without_tp_plan.py: both ranks raise it at 5.25.0 (its "
        "base_model_tp_plan {}), both load at 5.24.0, torch 2.13.0 CPU (`harness repro` refuses this case: the "
        "encoder is fed pixel patches)",
        bisected=(
            _BISECT_5_25.format(selection="test_training_steps and dots3_note_vision_encoder-ep-2",
                                answer=_FIRST_BAD_5_25.format(seconds=53)),
            _LIVE_AT_5_25,
        ),
    ),
    KnownBug(
        key="param2moe-fused-qkv-split",
        transformers=">=5.25",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_25,
        layouts=(Layout.EP, Layout.FSDP_EP),
        checks=(Check.LOAD, Check.GRADIENTS),
        families=("param2moe",),
        raises="RuntimeError",
        match=r"issues during automatic conversion of the weights",
        cause="sarvam-fused-qkv-split in a family new in 5.25.0: sharded loading splits the checkpoint's fused "
        "query_key_value by the targets' full sizes while the tensor holds one rank's share ('split_sizes to sum "
        "exactly to 128 ..., but got [128, 64, 64]', destined for self_attn.q_proj.weight)",
        reproduced=_REPRO_5_25.format(
            case="param2moe-ep-2-float32-wide",
            what="rank 1 RuntimeError 'We encountered some issues during automatic conversion of the weights' at "
            "transformers/utils/loading_report.py:311",
        ),
        bisected=(
            "lower end: 5.25.0, the first release with param2moe (no model folder in 5.24.0)",
            _BISECT_5_25.format(selection="test_training_steps and param2moe-ep-2", answer=_NO_FOLDER_5_24),
            _LIVE_AT_5_25,
        ),
    ),
    KnownBug(
        key="ergo-fsdp-ep-shard-shapes",
        transformers=">=5.25",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_25,
        layouts=(Layout.FSDP_EP,),
        checks=(Check.LOAD,),
        families=("ergo",),
        raises="RuntimeError",
        match=r"You set `ignore_mismatched_sizes` to `False`",
        cause="FSDP2+EP loading of ergo (new in 5.25.0) gives its shared experts and router gate shards of another "
        "layout than the model's (load report: shared_experts.down_proj.weight ckpt [64, 16] vs model [32, 32], "
        "gate.linear.weight [8, 32] vs [4, 64]) and refuses them as mismatched sizes",
        reproduced=_REPRO_5_25.format(
            case="ergo-fsdp_ep-2-float32-wide",
            what="rank 0 RuntimeError 'You set `ignore_mismatched_sizes` to `False`' at "
            "transformers/utils/loading_report.py:316, the load report's MISMATCH rows as in the cause",
        ),
        bisected=(
            "lower end: 5.25.0, the first release with ergo (no model folder in 5.24.0)",
            _BISECT_5_25.format(selection="test_training_steps and ergo-fsdp_ep-2", answer=_NO_FOLDER_5_24),
            _LIVE_AT_5_25,
        ),
    ),
)

ENTRIES: tuple[KnownBug, ...] = _NEW_IN_5_25_BUGS
