"""transformers 5.24.0: ZAYA declares an expert-parallel plan (ZayaConfig.base_model_ep_plan) but no tensor-parallel
plan, so it cannot be loaded expert-parallel at all (what this script prints on 2 gloo ranks, torch 2.13.0 CPU):

- DistributedConfig(ep_size=2, tp_size=2), the suite's EP layout from 5.23 on: ValueError: `tp_size=2` was
  requested, but `ZayaForCausalLM` has no `tp_plan`.
- DistributedConfig(ep_size=2) alone (tp_size 1): ValueError: `ep_size` must divide `fsdp_size * tp_size`.
  (EP rides on the TP or FSDP mesh; from 5.23 EP beside replicated dense weights is refused: loading/tf_adapter.py.)

The same holds for openai_privacy_filter (upstream/repros/sharded_load_errors_5_24.py). FSDP2 + EP
(DistributedConfig(ep_size=2, fsdp_size=2)) loads ZAYA and matches the whole model in the suite.

Run by hand: python tests/gpu/upstream/repros/zaya_ep_without_tp_plan.py
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import ZayaConfig, ZayaForCausalLM
from transformers.distributed.configuration_utils import DistributedConfig

CONFIG = dict(vocab_size=128, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=16,
              num_key_value_heads=8, head_dim=8, num_experts=8, num_experts_per_tok=1, router_hidden_size=64,
              max_position_embeddings=64, tie_word_embeddings=False)


def rank(index: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29571")
    dist.init_process_group("gloo", rank=index, world_size=2)
    for layout in ({"ep_size": 2, "tp_size": 2}, {"ep_size": 2}):
        try:
            ZayaForCausalLM.from_pretrained(folder, distributed_config=DistributedConfig(**layout))
            outcome = "loaded"
        except Exception as error:  # the point is to print what it raises
            outcome = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        print(f"rank {index}, DistributedConfig({layout}): {outcome}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    print("ZayaConfig.base_model_tp_plan:", ZayaConfig.base_model_tp_plan)
    print("ZayaConfig.base_model_ep_plan:", ZayaConfig.base_model_ep_plan)
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        ZayaForCausalLM(ZayaConfig(**CONFIG)).save_pretrained(folder)
        mp.spawn(rank, args=(folder,), nprocs=2)
