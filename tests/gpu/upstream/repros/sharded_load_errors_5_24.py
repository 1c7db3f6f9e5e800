"""transformers 5.24.0: loading (or running) a tiny model sharded by transformers itself raises, per family
(what this script prints on 2 gloo ranks, torch 2.13.0 CPU):

- gemma4_text (fsdp_ep): RuntimeError: Cannot concatenate overlapping meshes: [DeviceMesh((fsdp=2), ...
- diffusion_gemma_text (fsdp_ep): the same
- sarvam_moe (ep): RuntimeError: We encountered some issues during automatic conversion of the weights.
- sarvam_moe, lara_mini (fsdp_ep): the same
- inkling2_loop_text (fsdp_ep): RuntimeError: You set `ignore_mismatched_sizes` to `False`, thus raising an error.
- dots3_note_text (ep): AmbiguousGlobalPerLayerAttributeError: 'qk_rope_head_dim' is a per-layer attribute
- glm5_next_text (ep): RuntimeError: mat1 and mat2 shapes cannot be multiplied (128x64 and 32x64)
- inkling_text (ep): AssertionError in torch's DTensor _reduce_value, from InklingRMSNorm.forward
- muse_spark_text (ep): AssertionError in torch's DTensor _reduce_value, from MuseSparkRMSNorm._norm
- openai_privacy_filter (ep): ValueError: `tp_size=2` was requested, but `OpenAIPrivacyFilterModel` has no `tp_plan`

Causes, read from the load reports and transformers' code:
- sarvam_moe, lara_mini, inkling2_loop_text: a checkpoint-conversion op runs on an already sharded tensor. The
  fused checkpoint rows (sarvam_moe `query_key_value`, lara_mini `in_proj_qkv`) are split by the targets' full
  sizes while the tensor holds one rank's share (`split_with_sizes expects split_sizes to sum exactly to 128 ...,
  but got split_sizes=[128, 64, 64]`); inkling2_loop's merged `message_input.query` comes out [12, 4, 64] for a
  [6, 4, 64] FSDP shard (rank 0 reports the size mismatch, rank 1 the conversion error).
- gemma4_text, diffusion_gemma_text: raised in transformers/distributed/fsdp.py (fully_shard over the fsdp mesh).
  Their EP plans also hold TP styles for the dense MLP (`layers.*.mlp.gate_proj: colwise`, ...), so those
  weights are DTensors over the ep mesh, which spans the same ranks as the fsdp mesh (read, not verified).
- glm5_next_text: the TP plan's `layers.*.self_attn.o_proj: rowwise` also matches the linear-attention layers'
  o_proj, whose input is not column-sharded.
- openai_privacy_filter: the config declares an EP plan but no TP plan, and EP beside replicated dense weights is
  refused from 5.23 on, so EP cannot be used at all.
- inkling_text (the suite's first line on torch 2.11: `RuntimeError: aten.mul.Tensor got mixed torch.Tensor and
  DTensor`) and muse_spark_text: a DTensor leaves a sharded module and reaches a plain RMSNorm.

ep: DistributedConfig(ep_size=2, tp_size=2); fsdp_ep: DistributedConfig(ep_size=2, fsdp_size=2). Each rank loads
the checkpoint sharded, runs a forward without gradients, then a forward and a backward, and prints the first
line of what it raised (or "no error") and where.

Run by hand: python tests/gpu/upstream/repros/sharded_load_errors_5_24.py FAMILY ep|fsdp_ep
"""

import importlib
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoConfig
from transformers.distributed.configuration_utils import DistributedConfig

LAYOUTS = {"ep": {"ep_size": 2, "tp_size": 2}, "fsdp_ep": {"ep_size": 2, "fsdp_size": 2}}
COMMON = {
    "num_hidden_layers": 3,
    "vocab_size": 128,
    "hidden_size": 64,
    "max_position_embeddings": 64,
    "initializer_range": 0.07,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
ATTENTION = {"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 8}
MLA = {
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 4,
    "v_head_dim": 8,
}
DSA = {"index_topk": 16, "index_head_dim": 8, "index_n_heads": 4}
INKLING = ATTENTION | {
    "swa_num_attention_heads": 16,
    "swa_num_key_value_heads": 8,
    "swa_head_dim": 8,
    "layer_types": ["hybrid_sliding", "hybrid", "hybrid"],
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
}
GEMMA = ATTENTION | {
    "intermediate_size": 128,
    "sliding_window": 8,
    "num_experts": 8,
    "top_k_experts": 2,
    "layer_types": ["sliding_attention", "full_attention", "full_attention"],
    "moe_intermediate_size": 32,
    "enable_moe_block": True,
}
# family -> (model class, config keywords): 3 layers, 8 experts of which 2 per token, hidden size 64
FAMILIES = {
    "gemma4_text": ("gemma4.modeling_gemma4.Gemma4ForCausalLM", GEMMA | {"vocab_size_per_layer_input": 128}),
    "diffusion_gemma_text": ("diffusion_gemma.modeling_diffusion_gemma.DiffusionGemmaEncoderTextModel", GEMMA),
    "sarvam_moe": (
        "glm4_moe.modeling_glm4_moe.Glm4MoeForCausalLM",
        ATTENTION
        | {
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "n_routed_experts": 8,
            "n_group": 4,
            "topk_group": 2,
            "first_k_dense_replace": 1,
        },
    ),
    "lara_mini": (
        "lara_mini.modeling_lara_mini.LaraMiniForCausalLM",
        ATTENTION
        | {
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
            "linear_num_key_heads": 8,
            "linear_num_value_heads": 8,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "num_experts_per_tok": 2,
            "num_experts": 8,
            "sliding_window": 8,
            "layer_types": ["linear_attention", "sliding_attention", "full_attention"],
        },
    ),
    "inkling2_loop_text": (
        "inkling2_loop.modeling_inkling2_loop.Inkling2LoopForCausalLM",
        INKLING | {"unpadded_vocab_size": 128},
    ),
    "inkling_text": (
        "inkling.modeling_inkling.InklingForCausalLM",
        INKLING | {"mlp_layer_types": ["sparse", "sparse", "sparse"], "intermediate_size": 128, "n_shared_experts": 1},
    ),
    "dots3_note_text": (
        "dots3_note.modeling_dots3_note.Dots3NoteForCausalLM",
        MLA
        | DSA
        | {
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "n_shared_experts": 1,
            "n_routed_experts": 8,
            "q_lora_rank": 32,
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 2,
            "mlp_layer_types": ["dense", "sparse", "sparse"],
            "sliding_window": 8,
            "layer_types": ["indexed_attention", "sliding_attention", "indexed_attention"],
            "shared_experts_intermediate_size": 32,
        },
    ),
    "glm5_next_text": (
        "glm5_next.modeling_glm5_next.Glm5NextTextModel",
        MLA
        | DSA
        | {
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "n_shared_experts": 1,
            "n_routed_experts": 8,
            "q_lora_rank": 32,
            "n_group": 4,
            "topk_group": 2,
            "num_experts_per_tok": 2,
            "mlp_layer_types": ["dense", "sparse", "sparse"],
            "linear_head_dim": 8,
            "linear_num_heads": 8,
            "layer_types": ["linear_attention", "indexed_attention", "linear_attention"],
        },
    ),
    "muse_spark_text": (
        "muse_spark.modeling_muse_spark.MuseSparkTextModel",
        ATTENTION
        | {
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "moe_intermediate_size": 32,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "moe_hidden_size": 32,
            "mlp_layer_types": ["sparse", "sparse"],
        },
    ),
    "openai_privacy_filter": (
        "openai_privacy_filter.modeling_openai_privacy_filter.OpenAIPrivacyFilterModel",
        ATTENTION | {"num_local_experts": 8, "intermediate_size": 128, "sliding_window": 8, "num_experts_per_tok": 2},
    ),
}
# the generic configs give MLA families one qk_rope_head_dim; glm5_next's text config takes none
FAMILIES["glm5_next_text"][1].pop("qk_rope_head_dim")


def model_class(family: str):
    module, name = FAMILIES[family][0].rsplit(".", 1)
    return getattr(importlib.import_module(f"transformers.models.{module}"), name)


def rank_main(rank: int, path: str, family: str, layout: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29671", RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        config = DistributedConfig(**LAYOUTS[layout])
        model = model_class(family).from_pretrained(
            path, dtype=torch.float32, experts_implementation="grouped_mm", distributed_config=config
        )
        batch = torch.randint(0, 128, (8, 16), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():  # inference first (EP all-reduces a shared batch), then a training step (all-to-all)
            model(batch)
        output = model(batch)
        (output.logits if hasattr(output, "logits") else output.last_hidden_state).square().mean().backward()
        print(f"rank {rank} {family} {layout}: no error")
    except Exception as error:  # the finding: what the rank raised
        first_line = (str(error).splitlines() or ["(no message)"])[0]
        frames = traceback.extract_tb(error.__traceback__)
        where = [f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno} {frame.name}" for frame in frames]
        in_transformers = [frame for frame in where if frame.startswith("transformers/")]
        print(f"rank {rank} {family} {layout}: {type(error).__name__}: {first_line}")
        print(f"rank {rank}   raised at {where[-1]}; last transformers frames {' <- '.join(in_transformers[:-4:-1])}")
    os._exit(0)  # a rank that raised may leave its peer waiting in a collective: do not tear the group down


if __name__ == "__main__":
    family, layout = sys.argv[1], sys.argv[2]
    config = AutoConfig.for_model(family, **(COMMON | FAMILIES[family][1]))
    torch.manual_seed(0)
    path = tempfile.mkdtemp()
    model_class(family)(config).save_pretrained(path)
    mp.spawn(rank_main, args=(path, family, layout), nprocs=2)
