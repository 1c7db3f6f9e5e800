"""What the training layer (training/steps.py) found: bugs that one forward and backward never shows."""

from __future__ import annotations

from checks.kinds import Check, Layout

from upstream.entry import KnownBug
from upstream.table.common import LIVE_AT_5_24, RUN_ON_2_13_ONLY, TORCH_2_11_AND_2_13, TORCH_2_13_ONLY, bisect_to_5_24

# What the training layer (training/steps.py) found: bugs that one forward and backward never shows.
# Every EP family whose TP plan gives its attention norms `replicated_with_grad_allreduce` (at 5.24.0, measured:
# these are the declared families whose EP training case failed so, float32, 2 gloo ranks).
_GRAD_ALLREDUCE_FAMILIES = (
    "beam", "diffusion_gemma_text", "dots1", "exaone_moe", "gemma4_text", "hy_v3", "kolibri1", "laguna", "lara_mini",
    "mellum", "qwen3_5_moe_text", "qwen3_moe", "qwen3_next", "qwen3_omni_moe_talker_text",
)
_CLIP_EP = "harness bisect --package transformers -- -k 'test_training_clips_with_torch_clip_grad_norm and mixtral-ep'"
_CLIP_FSDP_EP = ("harness bisect --package transformers -- -k "
                 "'test_training_clips_with_torch_clip_grad_norm and mixtral-fsdp_ep'")
_FUSED_EP = "harness bisect --package transformers -- -k 'test_training_optimizer_kernels and mixtral-ep-fused'"
# The GPU host's own CPU, torch 2.11.0+cu130 with transformers 5.24.0 carried as a wheel, HARNESS_CPU_RANKS=8,
# `pytest tests/gpu/test_training.py -k "not wide"` (worlds 2, 4 and 8), 2026-12-03: the training entries so marked
# failed there as on 2.13.0 (torch 2.11 writes "aten.op: got mixed", with a colon).
RUN_ON_2_11_WITH_5_24_TRAINING = (
    "2.13.0 (the bisects) and 2.11.0 (the GPU host's CPU, transformers 5.24.0, gloo, worlds 2-8: the covered "
    "cases failed with this entry's type and message, 2026-12-03); 2.12 between them not run"
)
_TRAINING_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        key="replicated-grad-allreduce-training",
        transformers=">=5.23",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24_TRAINING,
        layouts=(Layout.EP,),
        checks=(Check.TRAIN,),
        families=_GRAD_ALLREDUCE_FAMILIES,
        raises="AssertionError",
        match=r"^step 1: gradients differ from the whole model's: .*self_attn\.[qk]_norm\.weight .*"
        r"\(accumulated over 2 micro-batches\)$",
        cause="the 'replicated_with_grad_allreduce' parallel style (ReplicatedWithGradAllReduce) all-reduces "
        "param.grad in a post-accumulate-grad hook after every backward: with gradient accumulation it sums the "
        "whole accumulated gradient again, so the first micro-batch's q/k norm gradient counts world-size times",
        reproduced="upstream/repros/ep_grad_allreduce_accumulation.py: Qwen3-MoE q/k norm gradients' largest "
        "relative error 7.17e-07 with 1 micro-batch, 0.988 with 2 (every other parameter 7.19e-07), 5.24.0, 2 CPU "
        "ranks; upstream/repros/qwen3_omni_talker_ep_grad_allreduce_accumulation.py: the talker's, 4.5e-05 with 1, "
        "0.472 with 2",
        bisected=(
            bisect_to_5_24("5.22.2", "test_training_steps and qwen3_moe-ep-2-float32",
                    "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 190s"),
            bisect_to_5_24("5.22.2", "test_training_steps and qwen3_omni_moe_talker_text-ep-2",
                    "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 56s"),
            LIVE_AT_5_24,
        ),
    ),
    KnownBug(
        key="text-config-qk-norm-training",
        transformers=">=5.23",
        torch=TORCH_2_13_ONLY,
        torch_verified=RUN_ON_2_13_ONLY,
        layouts=(Layout.EP,),
        checks=(Check.TRAIN,),
        families=("qwen3_vl_moe_text", "qwen3_omni_moe_text"),
        raises="AssertionError",
        match=r"^step 1: parameter \S*self_attn\.[qk]_norm\.weight differs across ranks",
        cause="the one-step entry's bug (the text configs' TP plan lacks q_norm/k_norm "
        "'replicated_with_grad_allreduce'), seen in training: each rank updates its replicated q/k norm with its "
        "own half of the gradient, so the replicas part after the first step",
        reproduced="upstream/repros/qwen3_vl_omni_ep_qk_norm_gradients.py FAMILY (the gradients); in the suite "
        "layers.0.self_attn.q_norm.weight differs by 0.000999 between the ranks after step 1, 5.24.0, 2 CPU ranks",
        bisected=(
            bisect_to_5_24("5.22.2", "test_training_steps and qwen3_vl_moe_text-ep-2-float32",
                    "first bad: transformers 5.23.0 (last good 5.22.2); 3 probes, 81s"),
            LIVE_AT_5_24,
        ),
    ),
    KnownBug(
        key="ep-clip-grad-norm-mixed-dtensor",
        transformers=">=5.16",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24_TRAINING,
        layouts=(Layout.EP,),
        checks=(Check.TORCH_CLIP,),
        raises="RuntimeError",
        match=r"^aten\._foreach_norm\.Scalar:? got mixed torch\.Tensor and DTensor",
        cause="an EP model holds DTensor parameters (experts; from 5.23 the TP-sharded dense weights) beside plain "
        "tensors (norms, routers): torch.nn.utils.clip_grad_norm_ takes every gradient in one foreach norm and "
        "refuses the mix (with foreach=False: 'All operands in aten.stack.default must have the same mesh')",
        reproduced="upstream/repros/ep_mixed_meshes_clip_and_fused_adamw.py ep: 14 DTensor and 11 plain "
        "parameters, clip_grad_norm_ raises with foreach and without, 5.24.0, 2 CPU ranks",
        bisected=(
            f"{_CLIP_EP} --good 5.13.0 --bad 5.24.0: the good end fails, otherwise: step 1: parameter "
            "model.embed_tokens.weight differs across ranks (as at 5.15.0: replicas part before the clip)",
            f"{_CLIP_EP} --good 5.16.0 --bad 5.17.0, --good 5.17.0 --bad 5.18.0, --good 5.18.0 --bad 5.22.2, "
            "--good 5.22.2 --bad 5.24.0: each good end fails this way (RuntimeError: aten._foreach_norm.Scalar got "
            "mixed torch.Tensor and DTensor); 1 probe each, 22-32s",
            "lower end: 5.16.0, the first release probed after 5.15.0 (which fails before the clip)",
            LIVE_AT_5_24,
        ),
    ),
    KnownBug(
        key="fsdp-ep-clip-grad-norm-meshes",
        transformers=">=5.20",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24_TRAINING,
        layouts=(Layout.FSDP_EP,),
        checks=(Check.TORCH_CLIP,),
        raises="RuntimeError",
        match=r"^All operands in aten\.stack\.default must have the same mesh",
        cause="an FSDP2+EP model's parameters live on two meshes (the experts on efsdp x ep, the rest on fsdp): "
        "torch.nn.utils.clip_grad_norm_ stacks their norms as one DTensor and refuses meshes that differ",
        reproduced="upstream/repros/ep_mixed_meshes_clip_and_fused_adamw.py fsdp_ep: 25 DTensor parameters on "
        "DeviceMesh((efsdp=1, ep=2)) and DeviceMesh((fsdp=2)), clip_grad_norm_ raises with foreach and without, "
        "5.24.0, 2 CPU ranks",
        bisected=(
            f"{_CLIP_FSDP_EP} --good 5.20.0 --bad 5.24.0: the good end fails this way; 1 probe, 78s",
            "lower end: 5.20.0, the FSDP2+EP floor, fails so",
            LIVE_AT_5_24,
        ),
    ),
    KnownBug(
        key="ep-fused-adamw-mixed-dtensor",
        transformers=">=5.16",
        torch=TORCH_2_11_AND_2_13,
        torch_verified=RUN_ON_2_11_WITH_5_24_TRAINING,
        layouts=(Layout.EP,),
        checks=(Check.FUSED_ADAMW,),
        raises="RuntimeError",
        match=r"^aten\._fused_adamw_\.default:? got mixed torch\.Tensor and DTensor",
        cause="the EP model's DTensor parameters beside plain tensors (as for clip_grad_norm_): "
        "torch.optim.AdamW(fused=True) steps every parameter in one fused call and refuses the mix",
        reproduced="upstream/repros/ep_mixed_meshes_clip_and_fused_adamw.py ep: AdamW(fused=True).step() raises, "
        "5.24.0, 2 CPU ranks (FSDP2+EP, all DTensors, steps)",
        bisected=(
            f"{_FUSED_EP} --good 5.13.0 --bad 5.24.0: the good end fails, otherwise: step 1: parameter "
            "model.embed_tokens.weight differs across ranks",
            f"{_FUSED_EP} --good 5.16.0 --bad 5.17.0, --good 5.22.2 --bad 5.24.0: each good end fails this way; "
            "1 probe each, 13-19s",
            "lower end: 5.16.0, as for clip_grad_norm_",
            LIVE_AT_5_24,
        ),
    ),
    KnownBug(
        key="fully-shard-save-pretrained",
        transformers=">=5.1",
        torch=TORCH_2_11_AND_2_13,
        torch_verified="2.13.0 (the bisect) and 2.11.0 (the GPU host's CPU, transformers 5.24.0 carried, 2 gloo "
        "ranks: test_save_pretrained_after_training_loads_back_whole[qwen3-fully_shard] failed so, 2026-12-03); "
        "2.12 between them not run",
        layouts=(Layout.FULLY_SHARD,),
        checks=(Check.SAVE_PRETRAINED,),
        raises="RuntimeError",
        match=r"^Attempted to access the data pointer on an invalid python storage",
        cause="save_pretrained gathers sharded weights only for a model loaded with a distributed_config "
        "(gather_sharded_state_dict_for_save); a model sharded by the user with torch's fully_shard reaches "
        "safetensors with its DTensor shards, whose storage it cannot read",
        reproduced="upstream/repros/fully_shard_save_pretrained.py: tiny Qwen3, fully_shard on 2 gloo ranks, "
        "save_pretrained raises on rank 0 (every rank up to 5.13); with state_dict=get_model_state_dict(..., "
        "full_state_dict=True) it saves, 5.24.0; by hand also 5.6.0, 5.13.0, 5.20.0, 5.22.2, 5.23.0",
        bisected=(
            "harness bisect --package transformers --good 5.0.0 --bad 5.6.0 -- -k "
            "'test_save_pretrained_after_training_loads_back_whole and qwen3-fully_shard': first bad: transformers "
            "5.1.0 (last good 5.0.0); 5 probes, 310s (--good 4.57.6 cannot run the case: the suite's loading passes "
            "experts_implementation, which 4.57's Qwen3 refuses)",
            "upper end: none, the bug is live (5.24.0, the newest release then, fails so: the suite's own run and "
            "the repro)",
        ),
    ),
)

ENTRIES: tuple[KnownBug, ...] = _TRAINING_BUGS
