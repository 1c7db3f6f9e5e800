"""transformers 5.24.0, expert parallelism (DistributedConfig(ep_size=2, tp_size=2)), HY-V4 and HY-V4-VL's
text model: the suite finds the gradients of the hyper-connection head (hc_head.hc_base, hc_fn, hc_scale)
differ from the whole model's by 3e-5..1e-3 relative at float32 (the suite's bound is 2.85e-5). Beside each,
the noise floor: the whole model's own gradient with the batch summed in another order (two halves). float64
does not tell rounding from a wrong gradient here: the hyper-connections hold float32 parameters and compute
in float32 (.float()).

Measured (transformers 5.24.0, torch 2.13.0 CPU, float32), EP error vs noise floor:
hy_v4: hc_fn 4.1e-4 vs 2.5e-4, hc_scale 2.9e-4 vs 2.7e-4, hc_base 2.0e-4 vs 1.7e-5;
hy_v4_vl_text: hc_fn 7.4e-4 vs 5.4e-4, hc_scale 6.0e-4 vs 3.2e-4, hc_base 1.6e-4 vs 1.5e-4.
The whole model's own hc_* gradients move by as much when only the summation order changes: these are
float32-sensitive parameters, not (on this evidence) an EP bug; hy_v4's hc_base, 12x its floor, is the exception.

Run by hand: python tests/gpu/upstream/repros/hy_v4_ep_hyper_connection_gradients.py hy_v4|hy_v4_vl_text float32|float64
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoConfig
from transformers.distributed.configuration_utils import DistributedConfig
from transformers.models.hy_v4.modeling_hy_v4 import HYV4ForCausalLM
from transformers.models.hy_v4_vl.modeling_hy_v4_vl import HYV4VLTextModel

# 3 layers (the first dense), 8 experts of which 2 per token, hidden size 64, MLA with a sparse-attention indexer
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=16,
    num_key_value_heads=16,
    max_position_embeddings=64,
    initializer_range=0.07,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_nope_head_dim=4,
    qk_rope_head_dim=4,
    v_head_dim=8,
    mlp_layer_types=["dense", "sparse", "sparse"],
    layer_types=["indexed_attention"] * 3,
    index_topk=16,
    index_head_dim=8,
    index_n_heads=4,
)
MODELS = {"hy_v4": HYV4ForCausalLM, "hy_v4_vl_text": HYV4VLTextModel}
# the VL text model's validator: mrope sections sum to half the rotary dims
EXTRA = {
    "hy_v4_vl_text": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [0, 1, 1]}}
}


def scalar(output) -> torch.Tensor:
    return (output.logits if hasattr(output, "logits") else output.last_hidden_state).square().mean()


def rank_main(rank: int, path: str, family: str, dtype: torch.dtype) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29691", RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    batch = torch.arange(32).reshape(2, 16) % 128
    implementation = "grouped_mm" if dtype == torch.float32 else "eager"  # grouped_mm takes no float64
    whole = MODELS[family].from_pretrained(path, dtype=dtype, experts_implementation=implementation)
    config = DistributedConfig(ep_size=2, tp_size=2)
    sharded = MODELS[family].from_pretrained(
        path, dtype=dtype, experts_implementation=implementation, distributed_config=config
    )
    for model in (whole, sharded):
        scalar(model(batch)).backward()
    theirs = dict(whole.named_parameters())
    # the noise floor: the whole model's own gradient, the batch taken as two halves (the same loss, summed in
    # another order), against its gradient of the whole batch
    once = {name: param.grad.clone() for name, param in theirs.items() if param.grad is not None}
    whole.zero_grad()
    sum(scalar(whole(half)) for half in batch.chunk(2)).div(2).backward()
    noise = {
        name: ((param.grad - once[name]).norm() / once[name].norm()).item()
        for name, param in theirs.items()
        if name in once
    }
    for name, param in theirs.items():
        if name in once:
            param.grad = once[name]
    errors = {}
    for name, param in sharded.named_parameters():
        if param.grad is None or "experts" in name:
            continue
        mine = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
        expected = theirs[name].grad
        errors[name] = ((mine - expected).norm() / expected.norm()).item()
    worst = sorted(errors.items(), key=lambda item: -item[1])
    others = max(error for name, error in worst if ".hc_" not in name)
    hyper = ", ".join(f"{name} {error:.3g} (noise floor {noise[name]:.3g})" for name, error in worst if ".hc_" in name)
    if rank == 0:
        print(f"{family} {dtype} {implementation}: hyper-connection gradients' relative error: {hyper}")
        print(
            f"{family} {dtype} {implementation}: largest of the {len(worst)} other non-expert parameters: {others:.3g}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    family, dtype = sys.argv[1], getattr(torch, sys.argv[2])
    torch.manual_seed(0)
    path = tempfile.mkdtemp()
    config = AutoConfig.for_model(family, **(TINY | EXTRA.get(family, {})))
    MODELS[family](config).save_pretrained(path)
    mp.spawn(rank_main, args=(path, family, dtype), nprocs=2)
