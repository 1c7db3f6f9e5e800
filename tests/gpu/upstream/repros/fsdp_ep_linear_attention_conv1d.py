"""transformers 5.24.0, FSDP2 + expert parallelism (DistributedConfig(ep_size=2, fsdp_size=2)): the linear-attention
layers' short-convolution weights (self_attn.conv1d.weight) load wrong: a rank's FSDP shard (Shard(0) over the
fsdp mesh) is not its dim-0 chunk of the checkpoint's weight, in Bailing-Hybrid, Kimi-Linear and GLM-5-Next.
Every other dense parameter loads right.

Cause: the checkpoint keeps q, k and v's convolutions apart (q_conv1d, k_conv1d, v_conv1d) and loading
concatenates them (conversion_mapping.py: Concatenate(dim=0) into conv1d.weight). Under FSDP each rank
concatenates its own shard of each of the three, so its shard is [q share | k share | v share] instead of the
first or second half of [q | k | v]; the script checks that equality. The same class of bug as the conversion
errors of sarvam_moe, lara_mini and inkling2_loop (sharded_load_errors_5_24.py).

Run by hand: python tests/gpu/upstream/repros/fsdp_ep_linear_attention_conv1d.py FAMILY
(FAMILY: bailing_hybrid, kimi_linear or glm5_next_text)
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers.distributed.configuration_utils import DistributedConfig

# 3 layers (linear attention first), 8 experts of which 2 per token, hidden size 64; MLA attention elsewhere
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=16,
    num_key_value_heads=16,
    kv_lora_rank=16,
    qk_nope_head_dim=4,
    v_head_dim=8,
    initializer_range=0.07,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
    mlp_layer_types=["dense", "sparse", "sparse"],
    linear_head_dim=8,
    linear_num_heads=8,
)
FAMILIES = {
    "bailing_hybrid": dict(
        num_shared_experts=1,
        qk_rope_head_dim=4,
        num_expert_group=4,
        topk_group=2,
        num_experts_per_token=2,
        first_k_dense_replace=1,
        num_experts=8,
        layer_types=["linear_attention", "full_attention", "full_attention"],
    ),
    "kimi_linear": dict(
        num_shared_experts=1,
        qk_rope_head_dim=4,
        num_expert_group=4,
        topk_group=2,
        num_experts_per_token=2,
        num_experts=8,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
    ),
    "glm5_next_text": dict(
        n_shared_experts=1,
        n_routed_experts=8,
        q_lora_rank=32,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        index_topk=16,
        index_head_dim=8,
        index_n_heads=4,
        layer_types=["linear_attention", "indexed_attention", "linear_attention"],
    ),
}


def auto_class(family: str):
    return AutoModel if family == "glm5_next_text" else AutoModelForCausalLM  # glm5_next_text: a text model


def rank_main(rank: int, path: str, family: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29681", RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    whole = dict(auto_class(family).from_pretrained(path, dtype=torch.float32).named_parameters())
    config = DistributedConfig(ep_size=2, fsdp_size=2)
    sharded = auto_class(family).from_pretrained(path, dtype=torch.float32, distributed_config=config)
    wrong = []
    for name, param in sharded.named_parameters():
        if not hasattr(param, "to_local") or "experts" in name:  # the FSDP shards of the dense parameters
            continue
        chunks = whole[name].chunk(2)  # FSDP2's dim-0 shards (a rank past the last chunk holds none)
        expected = chunks[rank] if rank < len(chunks) else whole[name][:0]
        local = param.to_local()
        if local.shape != expected.shape or not torch.equal(local, expected):
            wrong.append(name)
            same_shape = local.shape == expected.shape
            difference = (
                f"{(local - expected).abs().max():.3g}" if same_shape else f"shape, {tuple(expected.shape)} expected"
            )
            # the checkpoint keeps q, k and v's convolutions apart, and loading concatenates them: is the shard
            # this rank's share of each of the three, concatenated?
            per_part = torch.cat([part.chunk(2)[rank] for part in whole[name].chunk(3)])
            print(
                f"rank {rank}: {name} {tuple(local.shape)} is not its share of the checkpoint's (largest difference "
                f"{difference}); it equals its share of each of q, k, v concatenated: {torch.equal(local, per_part)}"
            )
    print(f"rank {rank}: {len(wrong)} wrong FSDP shards")
    dist.destroy_process_group()


if __name__ == "__main__":
    family = sys.argv[1]
    config = AutoConfig.for_model(family, **(TINY | FAMILIES[family]))
    torch.manual_seed(0)
    path = tempfile.mkdtemp()
    auto_class(family).from_config(config).save_pretrained(path)
    mp.spawn(rank_main, args=(path, family), nprocs=2)
