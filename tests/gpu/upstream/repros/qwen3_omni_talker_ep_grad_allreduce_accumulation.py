"""transformers 5.24.0, expert parallelism with TP for the dense weights (DistributedConfig(ep_size=2, tp_size=2)):
gradient accumulation makes the q_norm/k_norm gradients of the Qwen3-Omni-MoE talker wrong, as
ep_grad_allreduce_accumulation.py shows for Qwen3-MoE: the talker's TP plan marks its q/k norms
`replicated_with_grad_allreduce`, whose post-accumulate-grad hook all-reduces the whole accumulated gradient after
every backward, so the first micro-batch counts world-size times.

This script loads a tiny talker (Qwen3OmniMoeTalkerModel: 2 layers, 16 heads, 8 experts; its expert stacks drawn
here, as its own init leaves them empty: qwen3_omni_talker_uninitialized_experts.py) whole and expert-parallel on 2
gloo ranks, feeds it inputs_embeds from its codec embedding (its forward has no token embedding), accumulates 1 or
2 micro-batches of the loss mean(last_hidden_state ** 2) on both, and prints the largest relative gradient error of
the q/k norm weights against the whole model, and of every other parameter. Printed (5.24.0, torch 2.13.0, 2 CPU
ranks): q/k norms 4.54e-05 with 1 micro-batch, 0.472 with 2; every other parameter 8.8e-05 and 8.5e-05 (this
script's random routing: the suite's decisive routing has the one-backward gradients within float32 bounds).

Run by hand: python tests/gpu/upstream/repros/qwen3_omni_talker_ep_grad_allreduce_accumulation.py
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers.distributed.configuration_utils import DistributedConfig
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTalkerTextConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeTalkerModel

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
              shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8,
              num_experts=8, num_experts_per_tok=2, max_position_embeddings=64, tie_word_embeddings=False)


def relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm()).item()


def loss(model, batch: torch.Tensor) -> torch.Tensor:
    hidden = model(inputs_embeds=model.get_input_embeddings()(batch), use_cache=False).last_hidden_state
    return hidden.full_tensor().pow(2).mean() if hasattr(hidden, "full_tensor") else hidden.pow(2).mean()


def rank(index: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29573")
    dist.init_process_group("gloo", rank=index, world_size=2)
    from torch.distributed.tensor import DTensor

    batches = torch.randint(0, 128, (2, 4, 16), generator=torch.Generator().manual_seed(0))
    for micro_batches in (1, 2):
        sharded = Qwen3OmniMoeTalkerModel.from_pretrained(
            folder, distributed_config=DistributedConfig(ep_size=2, tp_size=2)
        )
        whole = Qwen3OmniMoeTalkerModel.from_pretrained(folder)
        for model in (sharded, whole):
            for batch in batches[:micro_batches]:
                (loss(model, batch) / micro_batches).backward()
        expected = dict(whole.named_parameters())
        norms, others = [], []
        for name, param in sharded.named_parameters():
            if param.grad is None:
                continue
            if "experts." in name and "shared" not in name:  # each rank's share, against the same share
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                expected_grad = expected[name].grad.chunk(2)[index]
            else:
                grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
                expected_grad = expected[name].grad
            (norms if "_norm." in name and "self_attn" in name else others).append(relative(grad, expected_grad))
        print(f"rank {index}, {micro_batches} micro-batch(es): q/k norm gradients' largest relative error "
              f"{max(norms):.3g}; every other parameter's {max(others):.3g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        talker = Qwen3OmniMoeTalkerModel(Qwen3OmniMoeTalkerTextConfig(**CONFIG))
        with torch.no_grad():
            for layer in talker.layers:
                layer.mlp.experts.gate_up_proj.normal_(0.0, 0.02)
                layer.mlp.experts.down_proj.normal_(0.0, 0.02)
        talker.save_pretrained(folder)
        mp.spawn(rank, args=(folder,), nprocs=2)
