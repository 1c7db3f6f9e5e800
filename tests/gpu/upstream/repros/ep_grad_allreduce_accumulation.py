"""transformers, expert parallelism with TP for the dense weights (DistributedConfig(ep_size=2, tp_size=2)):
gradient accumulation makes the q_norm/k_norm gradients of Qwen3-MoE wrong.

Cause: the `replicated_with_grad_allreduce` parallel style (transformers/distributed/tensor_parallel.py,
ReplicatedWithGradAllReduce) all-reduces `param.grad` in a post-accumulate-grad hook, after every backward. The
hook sums the whole accumulated gradient, not the part this backward added: after the second micro-batch each
rank holds (world x first micro-batch's gradient) + the second's, so the first micro-batch counts `world` times.
One backward per step (the suite's gradient check) is right; two micro-batches are not.

This script loads a tiny Qwen3-MoE (2 layers, 16 heads, 8 experts) whole and expert-parallel on 2 gloo ranks,
accumulates the same 1 or 2 micro-batches on both (each loss / number of micro-batches), and prints the largest
relative gradient error of the q/k norm weights against the whole model, and of every other parameter.

Run by hand: python tests/gpu/upstream/repros/ep_grad_allreduce_accumulation.py
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.distributed.configuration_utils import DistributedConfig

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
              num_attention_heads=16, num_key_value_heads=8, head_dim=8, num_experts=8, num_experts_per_tok=2,
              max_position_embeddings=64, tie_word_embeddings=False)


def relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm()).item()


def rank(index: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29563")
    dist.init_process_group("gloo", rank=index, world_size=2)
    from torch.distributed.tensor import DTensor

    batches = torch.randint(0, 128, (2, 4, 16), generator=torch.Generator().manual_seed(0))
    for micro_batches in (1, 2):
        layout = DistributedConfig(ep_size=2, tp_size=2)
        sharded = Qwen3MoeForCausalLM.from_pretrained(folder, distributed_config=layout)
        whole = Qwen3MoeForCausalLM.from_pretrained(folder)
        for model in (sharded, whole):
            for batch in batches[:micro_batches]:
                (model(batch, labels=batch).loss / micro_batches).backward()
        expected = dict(whole.named_parameters())
        norms, others = [], []
        for name, param in sharded.named_parameters():
            grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
            if "experts" in name:  # each rank's share, compared with the same share of the whole model's
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                expected_grad = expected[name].grad.chunk(2)[index]
            else:
                expected_grad = expected[name].grad
            (norms if "_norm." in name and "self_attn" in name else others).append(relative(grad, expected_grad))
        print(f"rank {index}, {micro_batches} micro-batch(es): q/k norm gradients' largest relative error "
              f"{max(norms):.3g}; every other parameter's {max(others):.3g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        Qwen3MoeForCausalLM(Qwen3MoeConfig(**CONFIG)).save_pretrained(folder)
        mp.spawn(rank, args=(folder,), nprocs=2)
