"""torch 2.13: after the process groups that an FSDP2+EP load created are destroyed, a later FSDP2+EP load in
the same processes can get a DeviceMesh of the first load back, and fails with
`RuntimeError: Could not resolve the process group registered under the name 11`.

Cause (found with this script): DTensor's dispatch fast path keeps a sharding cache of its own in C++ beside the
Python lru_caches; its OutputSharding results hold the DeviceMesh of the call that first ran an op, and its key
compares meshes with DeviceMesh.__eq__ (ranks, layout, dim names; not process-group names). An equal mesh of a
later load gets the old mesh back, whose groups are gone. torch's own tests clear it between tests with
`torch._C._clear_DTensor_sharding_propagator_cache()`; the rank pool's per-call reset (harness/ranks/rank.py)
now does the same, and keeps any group a live mesh still names. `destroy` fails at the third load here
(transformers 5.24.0, torch 2.13.0); `keep`, or `destroy` after that clear, passes.

Run by hand: python tests/gpu/upstream/repros/fsdp_ep_after_destroyed_groups.py destroy|keep
"""

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rank_main(rank: int, paths: list[str], destroy: bool) -> None:
    from torch.distributed import distributed_c10d
    from transformers import AutoModelForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29631", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank)
    )
    dist.init_process_group("gloo", rank=rank, world_size=2)
    initial_groups = set(distributed_c10d._world.pg_map)
    for call, path in enumerate(paths):
        config = DistributedConfig(ep_size=2, fsdp_size=2)
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, distributed_config=config)
        print(f"rank {rank}: load {call} ok", flush=True)
        if destroy:  # what the rank pool does between calls
            for group in list(distributed_c10d._world.pg_map):
                if group not in initial_groups:
                    dist.destroy_process_group(group)
    dist.destroy_process_group()


if __name__ == "__main__":
    from models import families, tiny_models

    paths = [
        str(tiny_models.build_checkpoint(families.family(name), Path(tempfile.mkdtemp())))
        for name in ("deepseek_v3", "deepseek_v3", "gpt_oss")
    ]
    mp.spawn(rank_main, args=(paths, sys.argv[1:] == ["destroy"]), nprocs=2)
