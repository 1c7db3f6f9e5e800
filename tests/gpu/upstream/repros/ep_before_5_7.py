"""Expert-parallel loading below the suite's EP floor (5.7.0), for the families whose configs declared an EP plan
before it (models/ep_plan_history.json): the suite's tiny model of FAMILY, loaded through tf_adapter.load_sharded on 2
gloo CPU ranks, one forward and backward against the whole model read from the same checkpoint.

Run by hand in a venv of the release (torch 2.13.0, transformers==X, accelerate):
    python tests/gpu/upstream/repros/ep_before_5_7.py FAMILY [EXPERTS_IMPLEMENTATION]
(default: the one the suite's wide case runs; `none` passes none). Each rank prints its local expert count, the
largest logits difference and the largest relative gradient error (with its parameter), or the exception.

Seen with torch 2.13.0+cpu, accelerate 1.16.0:
- 4.54.0: every EP load raises `AttributeError: type object 'DistributedConfig' has no attribute 'from_config'`
  (tensor_parallel.distribute_model); 4.54.1 fixes it (llama4_text then fails in its forward:
  `RuntimeError: aten.mm.default got mixed torch.Tensor and DTensor`, at lm_head); 4.56.2 and 4.57.6: llama4_text
  loads 4 of 8 experts a rank and its logits match (1e-6; a router's gradient error 0.81; experts implementation
  `none`). Below 4.56 `dtype=` is `torch_dtype=`, which tf_adapter does not speak: there this script stops at
  `TypeError: Llama4ForCausalLM.__init__() got an unexpected keyword argument 'dtype'` (the 4.54 results above
  are from a hand-written probe of the same steps with `torch_dtype=`).
- 5.0.0 - 5.5.x pass the weight loader the TP plan (model._tp_plan) instead of the EP plan: gpt_oss (no TP plan)
  `UnboundLocalError: cannot access local variable 'tp_plan_alt' where it is not associated with a value`,
  llama4_text `KeyError: 'model.layers.*.feed_forward.shared_expert.down_proj'` (5.3.0; 5.0.0:
  `KeyError: 'model.layers.*.feed_forward'`), both in core_model_loading.convert_and_load_state_dict_in_model.
- 5.6.0 and 5.6.2 (the loader is handed model.tp_plan): with grouped_mm, gpt_oss, gemma4_text and
  openai_privacy_filter load 4 of 8 experts a rank, logits within 1e-5 of the whole model, every gradient error as
  at 5.7.0 (the largest on a router: 1.02 gpt_oss, 0.949 gemma4_text, 2.17 openai_privacy_filter, the same at
  5.7.0 in this script, whose loss is not the suite's). eager experts raise `RuntimeError: Class values must be
  smaller than num_classes.` as at 5.7-5.17 (known_bugs.py); llama4_text raises `ValueError: not enough values to
  unpack (expected 3, got 2)` in the EP router hook (tensor_parallel.RouterParallel._prepare_output_fn), as at 5.7.0.
"""

import os
import sys
import tempfile
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the suite's families and tf_adapter
from loading import tf_adapter
from models import families

WORLD_SIZE = 2
BATCH = torch.arange(32).reshape(2, 16) % 128


def _output(model):
    output = model(BATCH, use_cache=False)
    logits = output.logits if hasattr(output, "logits") else output.last_hidden_state
    return logits.full_tensor() if hasattr(logits, "full_tensor") else logits


def rank_main(rank: int, path: str, implementation: str | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29643", RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD_SIZE))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        cls = tf_adapter.model_class(path)
        whole = tf_adapter.load_whole(path, torch.float32, torch.device("cpu"), implementation, cls)
        sharded = tf_adapter.load_sharded(path, "ep", WORLD_SIZE, torch.float32, implementation, cls)
        experts = {
            (param.to_local() if hasattr(param, "to_local") else param).shape[0]
            for name, param in sharded.named_parameters()
            if ".experts." in name
        }
        logits = [_output(model) for model in (whole, sharded)]
        for model_logits in logits:
            model_logits.float().pow(2).mean().backward()
        worst = (0.0, "")
        for (name, mine), (_, theirs) in zip(sharded.named_parameters(), whole.named_parameters(), strict=True):
            grad = mine.grad.full_tensor() if hasattr(mine.grad, "full_tensor") else mine.grad
            reference = theirs.grad
            if grad.shape != reference.shape and grad.shape[1:] == reference.shape[1:]:  # this rank's experts
                rows = grad.shape[0]
                reference = reference[rank * rows : (rank + 1) * rows]
            elif grad.shape != reference.shape:  # a TP shard of a dense weight (a plain local tensor): not compared
                continue
            worst = max(worst, (((grad - reference).norm() / reference.norm()).item(), name))
        print(f"rank {rank}: local experts {sorted(experts)}, logits max |diff| "
              f"{(logits[0] - logits[1]).abs().max().item():.3g}, gradient error {worst[0]:.3g} ({worst[1]})")
    except Exception as error:  # reported: the point of the script
        where = [line for line in traceback.format_exc().splitlines() if "transformers/" in line][-1:]
        print(f"rank {rank}: {type(error).__name__}: {error} {where[0].strip() if where else ''}")
    dist.destroy_process_group()


if __name__ == "__main__":
    family = sys.argv[1]
    # default: the one a wide case runs (families.wide_implementation: grouped_mm where the model lets it be set)
    implementation = sys.argv[2] if len(sys.argv) > 2 else families.wide_implementation(family)
    implementation = None if implementation == "none" else implementation  # 4.x: no experts_implementation=
    torch.manual_seed(0)
    config = families.tiny_config(family)
    path = tempfile.mkdtemp(prefix=f"ep-before-5-7-{family}-")
    families.model_class(config)(config).save_pretrained(path)
    mp.start_processes(rank_main, args=(path, implementation), nprocs=WORLD_SIZE, join=True, start_method="spawn")
