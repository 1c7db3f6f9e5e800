"""transformers 5.24.0 (the newest checked): Nemotron-H's eager experts under expert parallelism index the EP
sentinel expert id into the local expert stack, at inference and in training.

Expert parallelism (transformers/distributed/expert_parallel.py) marks a token routed to another rank's experts
with the sentinel id num_local_experts. NemotronHExperts.forward (eager) one-hots the ids with
num_classes=num_experts + 1, so the sentinel gets a class of its own, then loops over every class that was hit,
the sentinel's included, and reads self.up_proj[num_local_experts]: `IndexError: index 4 is out of bounds for
dimension 0 with size 4`. The other families' eager experts skip the sentinel; grouped_mm and batched_mm run.
Reproduced with transformers 5.24.0, torch 2.13.0 CPU, 2 gloo ranks.

Run by hand: python tests/gpu/upstream/repros/nemotron_h_eager_ep_sentinel.py (raises while the bug is there).
"""

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM
from transformers.distributed.configuration_utils import DistributedConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the suite's tiny config and tf_adapter
from loading import tf_adapter
from models import families


def rank_main(rank: int, path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29623", RANK=str(rank), WORLD_SIZE="2")
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
    torch.manual_seed(0)
    path = tempfile.mkdtemp()
    AutoModelForCausalLM.from_config(families.tiny_config("nemotron_h")).save_pretrained(path)
    mp.spawn(rank_main, args=(path,), nprocs=2)
