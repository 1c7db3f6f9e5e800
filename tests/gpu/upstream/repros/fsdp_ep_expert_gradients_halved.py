"""transformers 5.20-5.22: under FSDP2 + expert parallelism (DistributedConfig(ep_size=N, fsdp_size=N)) every
expert stack's gradient is exactly 0.5x the whole model's on 2 ranks (its biases too, for GPT-OSS): the
expert gradients are averaged over the expert-FSDP group once more than the batch split calls for.

Reproduced with transformers 5.20.0 and 5.22.2, torch 2.13.0 CPU, 2 gloo ranks (ratio 0.5); 5.23.0 (the bisect's
first good release) and 5.24.0 give 1.0.
Run by hand: python tests/gpu/upstream/repros/fsdp_ep_expert_gradients_halved.py
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, Qwen3MoeConfig
from transformers.distributed.configuration_utils import DistributedConfig


def rank_main(rank: int, path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29651", RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    batch = torch.arange(64).reshape(4, 16) % 128
    whole = AutoModelForCausalLM.from_pretrained(path)
    # the reference loss: the mean of the two ranks' losses, each over its half of the batch
    sum(whole(half, labels=half).loss for half in batch.chunk(2)).div(2).backward()
    config = DistributedConfig(ep_size=2, fsdp_size=2)
    sharded = AutoModelForCausalLM.from_pretrained(path, distributed_config=config)
    mine = batch.chunk(2)[rank]
    sharded(mine, labels=mine).loss.backward()
    grad = sharded.model.layers[0].mlp.experts.gate_up_proj.grad
    grad = grad.to_local() if hasattr(grad, "to_local") else grad
    expected = whole.model.layers[0].mlp.experts.gate_up_proj.grad.chunk(2)[rank]  # this rank's experts
    print(f"rank {rank}: expert gradient / whole model's = {(grad * expected).sum() / (expected * expected).sum():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    config = Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=8,
        num_experts=8,
        num_experts_per_tok=2,
        initializer_range=0.07,
    )
    torch.manual_seed(0)
    path = tempfile.mkdtemp()
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    mp.spawn(rank_main, args=(path,), nprocs=2)
