"""transformers 5.24.0, expert parallelism (DistributedConfig(ep_size=2, tp_size=2)): GLM-4-MoE with its q/k norms
switched on (Glm4MoeConfig(use_qk_norm=True); default False, so the suite's default cases never build them): the
gradients of every attention layer's q_norm and k_norm weights differ from the whole model's by 0.5-0.9 relative,
per rank (the suite: `test_switches_on_load_logits_and_gradients[glm4_moe+switches-ep-*]`).

Cause: Glm4MoeConfig.base_model_tp_plan TP-shards q/k/v_proj colwise but has no
`layers.*.self_attn.q_norm/k_norm: "replicated_with_grad_allreduce"` entries (Qwen3MoeConfig's has them), so under
TP each rank's norm gradient covers only its half of the heads; summed over the ranks it matches the whole model's.
The same cause as upstream/repros/qwen3_vl_omni_ep_qk_norm_gradients.py, behind a switch here.

Run by hand: python tests/gpu/upstream/repros/glm4_moe_qk_norm_ep_gradients.py
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
from transformers.distributed.configuration_utils import DistributedConfig

CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=16, num_key_value_heads=8, head_dim=8, n_routed_experts=8, num_experts_per_tok=2,
    n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=0, initializer_range=0.07,
    tie_word_embeddings=False, use_qk_norm=True,
)


def rank_main(rank: int, path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29663", RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    batch = torch.arange(32).reshape(2, 16) % 128
    whole = Glm4MoeForCausalLM.from_pretrained(path, experts_implementation="grouped_mm")
    config = DistributedConfig(ep_size=2, tp_size=2)
    sharded = Glm4MoeForCausalLM.from_pretrained(path, experts_implementation="grouped_mm", distributed_config=config)
    for model in (whole, sharded):
        logits = model(batch).logits
        logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
        logits.square().mean().backward()
    theirs = dict(whole.named_parameters())
    for name, param in sharded.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            mine = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
            expected = theirs[name].grad
            summed = mine.clone()
            dist.all_reduce(summed)  # the ranks' norm gradients summed: each rank holds half the heads under TP
            print(
                f"rank {rank}: {name} gradient relative error {(mine - expected).norm() / expected.norm():.3g}"
                f" (summed over ranks: {(summed - expected).norm() / expected.norm():.3g})"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.manual_seed(0)
    path = tempfile.mkdtemp()
    Glm4MoeForCausalLM(Glm4MoeConfig(**CONFIG)).save_pretrained(path)
    mp.spawn(rank_main, args=(path,), nprocs=2)
