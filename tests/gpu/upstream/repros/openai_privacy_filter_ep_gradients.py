"""OpenAI Privacy Filter under expert parallelism (from its first EP plan, transformers 5.6.0), grouped_mm experts,
2 gloo CPU ranks: one backward of the sharded model against the whole model read from the same checkpoint.

- 5.6-5.7: every parameter's gradient is wrong, the router's the most (relative error 0.6-0.85); the logits agree.
- 5.8-5.16: the same, and the expert biases' gradients are garbage (NaN, or 1e+15 and more: memory never written).
- 5.17 on: every gradient agrees (relative error below 1e-6).

Run by hand in a venv of the release (torch 2.13.0, transformers==X):
    python tests/gpu/upstream/repros/openai_privacy_filter_ep_gradients.py
Each rank prints the largest logits difference, the router's and the expert biases' relative gradient errors (layer
0, its own experts), and the largest relative gradient error of any parameter.
"""

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import OpenAIPrivacyFilterConfig, OpenAIPrivacyFilterModel
from transformers.distributed.configuration_utils import DistributedConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the suite's tf_adapter
from loading import tf_adapter


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _error(mine, theirs):
    return ((mine - theirs).norm() / theirs.norm()).item()


def rank_main(rank: int, path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29647", RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    batch = torch.arange(32).reshape(2, 16) % 128
    whole = OpenAIPrivacyFilterModel.from_pretrained(path, experts_implementation="grouped_mm")
    config = DistributedConfig(**tf_adapter.distributed_config_kwargs("ep", 2))  # the release's EP arguments
    sharded = OpenAIPrivacyFilterModel.from_pretrained(path, experts_implementation="grouped_mm",
                                                       distributed_config=config)
    outputs = [model(batch).last_hidden_state for model in (whole, sharded)]
    for output in outputs:
        output.pow(2).mean().backward()
    mine, theirs = dict(sharded.named_parameters()), dict(whole.named_parameters())
    errors = {}
    for name, param in mine.items():
        grad, reference = _local(param.grad), theirs[name].grad
        if ".experts." in name:  # this rank's contiguous half of the experts
            rows = grad.shape[0]
            reference = reference[rank * rows : (rank + 1) * rows]
        errors[name] = _error(grad, reference)
    worst = max(errors, key=lambda name: errors[name] if errors[name] == errors[name] else float("inf"))
    print(
        f"rank {rank}: logits max |diff| {(outputs[0] - _local(outputs[1])).abs().max().item():.3g}; gradient error "
        f"router.weight {errors['layers.0.mlp.router.weight']:.3g}, "
        f"router.bias {errors['layers.0.mlp.router.bias']:.3g}, "
        f"experts.gate_up_proj_bias {errors['layers.0.mlp.experts.gate_up_proj_bias']:.3g}, "
        f"experts.down_proj_bias {errors['layers.0.mlp.experts.down_proj_bias']:.3g}; largest {errors[worst]:.3g} "
        f"({worst}); {sum(error > 1e-4 for error in errors.values())} of {len(errors)} above 1e-4"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    config = OpenAIPrivacyFilterConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, head_dim=8, num_hidden_layers=3,
        num_attention_heads=16, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
        max_position_embeddings=64, tie_word_embeddings=False, initializer_range=0.07, pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(0)
    path = tempfile.mkdtemp()
    OpenAIPrivacyFilterModel(config).save_pretrained(path)
    mp.spawn(rank_main, args=(path,), nprocs=2)
