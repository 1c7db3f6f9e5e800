"""transformers 5.25.0: the Dots3 Note vision encoder can no longer be loaded expert-parallel.

5.25.0 drops every 'moe_tp_experts' style from the models' TP plans. Dots3NoteVisionConfig's base_model_tp_plan held
only those, so it is empty from 5.25.0 while the config still declares an EP plan; EP needs TP for the dense weights
(from 5.23, EP beside replicated dense weights is refused), so `from_pretrained(..., distributed_config=
DistributedConfig(ep_size=2, tp_size=2))` raises `ValueError: tp_size=2 was requested, but Dots3NoteVisionModel has
no tp_plan`. At 5.24.0 the same load succeeds on 2 gloo ranks (torch 2.13.0 CPU).

This script prints the installed release's TP and EP plans of the config class, builds the suite's tiny vision
encoder (8 experts), saves it, and loads it EP on 2 gloo ranks; each rank prints what it raised or "loaded".

Run by hand: python tests/gpu/upstream/repros/dots3_vision_ep_without_tp_plan.py
"""

import os
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers
from transformers.distributed.configuration_utils import DistributedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

MODEL_TYPE = "dots3_note_vision_encoder"
# the suite's tiny config of this family (tests/gpu/models/families.py: tiny_config_kwargs), at 5.24.0 and 5.25.0 alike
TINY = {"adapter_in_dim": 64, "adapter_out_dim": 64, "hidden_size": 64, "initializer_range": 0.07,
        "intermediate_size": 128, "mlp_layer_types": ["dense", "sparse", "sparse"], "moe_intermediate_size": 32,
        "num_attention_heads": 16, "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_local_experts": 8,
        "patch_size": 7}


def tiny_config():
    return CONFIG_MAPPING[MODEL_TYPE](**TINY)


def model_class():
    from transformers.models.dots3_note.modeling_dots3_note import Dots3NoteVisionModel

    return Dots3NoteVisionModel


def rank(index: int, world: int, path: str, init: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=index, world_size=world)
    os.environ.update(RANK=str(index), WORLD_SIZE=str(world), LOCAL_RANK=str(index))
    try:
        model_class().from_pretrained(path, dtype=torch.float32,
                                    distributed_config=DistributedConfig(ep_size=world, tp_size=world))
        print(f"rank {index}: loaded")
    except Exception as error:  # what the release raises is the finding
        frame = traceback.extract_tb(error.__traceback__)[-1]
        print(f"rank {index}: {type(error).__name__}: {str(error).splitlines()[0]} ({frame.filename}:{frame.lineno})")
    finally:
        dist.destroy_process_group()


def main() -> None:
    cls = CONFIG_MAPPING[MODEL_TYPE]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"base_model_tp_plan: {dict(getattr(cls, 'base_model_tp_plan', None) or {})}")
    print(f"base_model_ep_plan: {dict(getattr(cls, 'base_model_ep_plan', None) or {})}")
    config = tiny_config()
    torch.manual_seed(0)
    model = model_class()(config)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        init = f"file://{folder}/rendezvous"
        mp.spawn(rank, args=(2, folder, init), nprocs=2)


if __name__ == "__main__":
    main()
