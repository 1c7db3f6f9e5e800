"""torch.nn.utils.clip_grad_norm_ and a fused AdamW step on a model transformers loaded expert-parallel raise:
the model holds DTensor parameters on several device meshes (the experts on the ep mesh; the dense weights the EP
plan shards with TP on the tp mesh; under FSDP2+EP the fsdp and efsdp x ep meshes) and, under EP, plain tensors
beside them (norms, routers). torch's clip_grad_norm_ and its foreach/fused optimizer kernels take all parameters
in one call and refuse the mix:

    RuntimeError: aten._foreach_norm.Scalar got mixed torch.Tensor and DTensor, need to convert all torch.Tensor
    to DTensor before calling distributed operators!            (EP, clip_grad_norm_ with foreach)
    RuntimeError: All operands in aten.stack.default must have the same mesh, ...   (foreach=False; FSDP2+EP)
    RuntimeError: aten._fused_adamw_.default got mixed torch.Tensor and DTensor, ...  (EP, AdamW(fused=True))

A user who trains an EP model as they train any model (forward, backward, clip, step) stops at the clip, or at
a fused step. transformers' own Trainer clips per mesh (`Trainer._mixed_mesh_grad_norm`), a plain loop cannot.
This script loads a tiny Qwen3-MoE (2 layers, 8 experts, 2 per token) on 2 gloo ranks with the layout's
DistributedConfig, prints how many parameters are DTensors and how many plain, runs a forward and a backward,
then clip_grad_norm_ (foreach, torch's default where it can, then foreach=False) and a fused AdamW step, and
prints what each raised.

Run by hand: python tests/gpu/upstream/repros/ep_mixed_meshes_clip_and_fused_adamw.py [ep|fsdp_ep]
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.distributed.configuration_utils import DistributedConfig

LAYOUTS = {"ep": {"ep_size": 2, "tp_size": 2}, "fsdp_ep": {"ep_size": 2, "fsdp_size": 2}}
CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
              max_position_embeddings=64, tie_word_embeddings=False)


def rank(index: int, folder: str, layout: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561", RANK=str(index), WORLD_SIZE="2",
                      LOCAL_RANK=str(index))
    dist.init_process_group("gloo", rank=index, world_size=2)
    from torch.distributed.tensor import DTensor

    model = Qwen3MoeForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                distributed_config=DistributedConfig(**LAYOUTS[layout]))
    kinds = [isinstance(p, DTensor) for p in model.parameters()]
    batch = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    model(batch, labels=batch).loss.backward()
    for foreach in (None, False):
        try:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=foreach)
            outcome = f"total norm {norm.full_tensor() if isinstance(norm, DTensor) else norm}"
        except Exception as error:
            outcome = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        print(f"rank {index} {layout}: {sum(kinds)} DTensor and {len(kinds) - sum(kinds)} plain parameters; "
              f"clip_grad_norm_(foreach={foreach}): {outcome}", flush=True)
    try:
        torch.optim.AdamW(model.parameters(), fused=True).step()
        outcome = "stepped"
    except Exception as error:  # printed: the point of the script
        outcome = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    print(f"rank {index} {layout}: AdamW(fused=True).step(): {outcome}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    layout = sys.argv[1] if len(sys.argv) > 1 else "ep"
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        Qwen3MoeForCausalLM(Qwen3MoeConfig(**CONFIG)).save_pretrained(folder)
        mp.spawn(rank, args=(folder, layout), nprocs=2)
