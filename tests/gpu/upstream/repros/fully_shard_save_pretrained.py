"""save_pretrained on a model sharded with torch's fully_shard (FSDP2 applied by the user, no DistributedConfig)
raises on rank 0 instead of gathering the DTensor shards or refusing clearly:

    RuntimeError: Attempted to access the data pointer on an invalid python storage.
        (safetensors/torch.py storage_ptr, from safe_save_file, from PreTrainedModel.save_pretrained)

save_pretrained gathers sharded weights only where the model carries `config.distributed_config`
(DistributedMixin.gather_sharded_state_dict_for_save: FSDP2 or TP loaded by transformers itself). A model that
transformers loaded whole and the user then sharded with torch.distributed.fsdp.fully_shard keeps DTensor
parameters, so `model.state_dict()` holds DTensor shards; they reach safetensors as they are, which cannot take a
DTensor's storage. The same model loaded with DistributedConfig(fsdp_size=2) saves (every rank calls it, rank 0
writes the gathered weights), and passing `state_dict=get_model_state_dict(model, options=StateDictOptions(
full_state_dict=True, cpu_offload=True))` works around it (both shown below).

This script saves a tiny Qwen3 (2 layers), runs 2 gloo ranks, loads it whole, applies fully_shard to each decoder
layer and the root, calls save_pretrained (every rank, as transformers documents for sharded models), then the
workaround, and prints what each did; then the same with DistributedConfig(fsdp_size=2).

Run by hand: python tests/gpu/upstream/repros/fully_shard_save_pretrained.py
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.distributed.configuration_utils import DistributedConfig

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=False)


def attempt(index: int, what: str, save) -> None:
    try:
        save()
        outcome = "saved"
    except Exception as error:  # printed: the point of the script
        outcome = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    print(f"rank {index} {what}: {outcome}", flush=True)


def rank(index: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29563", RANK=str(index), WORLD_SIZE="2",
                      LOCAL_RANK=str(index))
    dist.init_process_group("gloo", rank=index, world_size=2)
    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32)
    mesh = init_device_mesh("cpu", (2,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    out = os.path.join(folder, "out")
    attempt(index, "fully_shard, save_pretrained(folder)", lambda: model.save_pretrained(out))
    dist.barrier()  # rank 0 raised before transformers' own barrier (which it skips without a distributed_config)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    attempt(index, "fully_shard, save_pretrained(folder, state_dict=full state dict)",
            lambda: model.save_pretrained(out, state_dict=full))
    dist.barrier()
    loaded = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                              distributed_config=DistributedConfig(fsdp_size=2))
    attempt(index, "DistributedConfig(fsdp_size=2), save_pretrained(folder)", lambda: loaded.save_pretrained(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        Qwen3ForCausalLM(Qwen3Config(**CONFIG)).save_pretrained(folder)
        mp.spawn(rank, args=(folder,), nprocs=2)
