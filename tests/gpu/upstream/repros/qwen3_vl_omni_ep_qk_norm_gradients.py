"""transformers 5.24.0, expert parallelism (DistributedConfig(ep_size=2, tp_size=2)): the gradients of every
attention layer's q_norm and k_norm weights differ from the whole model's by 0.4-1.0 relative, per rank, in the
Qwen3-VL-MoE and Qwen3-Omni-MoE text models.

Cause: the base_model_tp_plan of Qwen3VLMoeTextConfig and Qwen3OmniMoeTextConfig lacks the
`layers.*.self_attn.q_norm/k_norm: "replicated_with_grad_allreduce"` entries that Qwen3MoeConfig's has (and the
Omni talker configs have), so under TP each rank's norm gradient covers only its half of the heads: summed over
the ranks it matches the whole model's. (Here the router's gradient also differs by about 0.02, and the summed
norm gradients by as much: this script's random routing has near ties; the suite's decisive routing finds only
the q/k norms out of bound.)

Run by hand: python tests/gpu/upstream/repros/qwen3_vl_omni_ep_qk_norm_gradients.py FAMILY
(FAMILY: qwen3_vl_moe_text or qwen3_omni_moe_text)
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Qwen3OmniMoeTextConfig, Qwen3VLMoeTextConfig
from transformers.distributed.configuration_utils import DistributedConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextModel
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextModel

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=8,
    num_experts_per_tok=2,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    initializer_range=0.07,
    tie_word_embeddings=False,
)
# the text models (no causal-LM head class maps their configs): (model class, config)
MODELS = {
    "qwen3_vl_moe_text": (Qwen3VLMoeTextModel, lambda: Qwen3VLMoeTextConfig(num_local_experts=8, **TINY)),
    "qwen3_omni_moe_text": (Qwen3OmniMoeThinkerTextModel, lambda: Qwen3OmniMoeTextConfig(num_experts=8, **TINY)),
}


def rank_main(rank: int, path: str, family: str) -> None:
    model_class = MODELS[family][0]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29661", RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    batch = torch.arange(32).reshape(2, 16) % 128
    whole = model_class.from_pretrained(path, experts_implementation="grouped_mm")
    config = DistributedConfig(ep_size=2, tp_size=2)
    sharded = model_class.from_pretrained(path, experts_implementation="grouped_mm", distributed_config=config)
    for model in (whole, sharded):
        model(batch).last_hidden_state.square().mean().backward()  # a base model: any scalar of its output
    theirs = dict(whole.named_parameters())
    for name, param in sharded.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight", "mlp.gate.weight")):
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
    model_class, config = MODELS[sys.argv[1]]
    model_class(config()).save_pretrained(path)
    mp.spawn(rank_main, args=(path, sys.argv[1]), nprocs=2)
