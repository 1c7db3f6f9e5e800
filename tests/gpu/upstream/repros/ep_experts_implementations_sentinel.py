"""transformers 5.7-5.17 (EP through enable_expert_parallel, from its first release), every MoE family:

- eager experts crash: the EP router marks other ranks' experts with the sentinel id num_local_experts, and the
  eager experts forward one-hots the ids with num_classes=num_local_experts:
  `RuntimeError: Class values must be smaller than num_classes.`
- batched_mm experts give a wrong router gradient: the sentinel slots' zeroed scores still reach the router
  (relative error of gate.weight's gradient 0.5-1.1 against the whole model).
- grouped_mm experts give a wrong router gradient too, up to 5.16.1 (0.806 / 0.616 on ranks 0 / 1 at 5.7.0 and
  5.13.0; measured again 2026-12-03: an earlier note here said grouped_mm agreed, which this script does not show).

Reproduced with transformers 5.7.0 and 5.17.0, torch 2.13.0 CPU, 2 gloo ranks; 5.18.0 (the bisect's first good
release) passes: eager runs, batched_mm's router gradient error is 0.
Run by hand: python tests/gpu/upstream/repros/ep_experts_implementations_sentinel.py eager|batched_mm|grouped_mm
"""

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, Qwen3MoeConfig
from transformers.distributed.configuration_utils import DistributedConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the suite's tf_adapter
from loading import tf_adapter


def rank_main(rank: int, path: str, implementation: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29641", RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    batch = torch.arange(32).reshape(2, 16) % 128
    whole = AutoModelForCausalLM.from_pretrained(path, experts_implementation=implementation)
    config = DistributedConfig(**tf_adapter.distributed_config_kwargs("ep", 2))  # the release's EP arguments
    sharded = AutoModelForCausalLM.from_pretrained(
        path, experts_implementation=implementation, distributed_config=config
    )
    for model in (whole, sharded):
        model(batch, labels=batch).loss.backward()  # eager: raises here on the sharded model
    mine, theirs = sharded.model.layers[0].mlp.gate.weight.grad, whole.model.layers[0].mlp.gate.weight.grad
    mine = mine.full_tensor() if hasattr(mine, "full_tensor") else mine
    print(
        f"rank {rank} {implementation}: router gradient relative error {((mine - theirs).norm() / theirs.norm()):.3g}"
    )
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
    mp.spawn(rank_main, args=(path, sys.argv[1]), nprocs=2)
