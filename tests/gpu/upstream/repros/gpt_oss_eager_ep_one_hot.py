"""transformers 5.18.0, and 5.23.0-5.24.0 (the newest checked): GPT-OSS's eager experts under expert parallelism
crash at inference (no_grad). (Up to 5.17.0 every family's eager experts do: ep_experts_implementations_sentinel.py.)

At inference with a shared batch, expert parallelism runs AllReduceEP (transformers/distributed/expert_parallel.py),
which marks tokens routed to another rank's experts with the sentinel id num_local_experts. GptOssExperts.forward
(eager) one-hots the ids with num_classes=num_local_experts, so the sentinel is out of range:
`RuntimeError: Class values must be smaller than num_classes.` With gradients (AllToAllEP) it runs, and the other
families' eager experts skip the sentinel. Reproduced with transformers 5.18.0, 5.23.0 and 5.24.0, torch 2.13.0 CPU,
2 gloo ranks; 5.19.0, 5.20.0 and 5.22.2 run without error (the bisects' first and last good releases).

Run by hand: python tests/gpu/upstream/repros/gpt_oss_eager_ep_one_hot.py (raises while the bug is there).
"""

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, GptOssConfig
from transformers.distributed.configuration_utils import DistributedConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the suite's tf_adapter
from loading import tf_adapter


def rank_main(rank: int, path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29621", RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = AutoModelForCausalLM.from_pretrained(
        path,
        experts_implementation="eager",
        distributed_config=DistributedConfig(**tf_adapter.distributed_config_kwargs("ep", 2)),
    )
    with torch.no_grad():
        model(torch.arange(16).reshape(1, 16))  # raises on every rank
    print(f"rank {rank}: no error (the bug is absent)")
    dist.destroy_process_group()


if __name__ == "__main__":
    config = GptOssConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        layer_types=["full_attention"],
    )
    path = tempfile.mkdtemp()
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    mp.spawn(rank_main, args=(path,), nprocs=2)
