"""`--harness-write-repro=FILE` (`harness repro TEST_ID`): the selected case's standalone reproducer, written in
place of launching its ranks; the test then skips with "repro written to FILE".

The script is repro_template.py with two parts replaced: its docstring (the test id, the releases and the harness
commit it was written for, how to run it) and its `CASE: dict = {}` line, by the case as data: plain literals printed by
pprint from the suite's own values (the family's tiny config, tf_adapter's loading arguments, tolerances' factors,
tiny_models' seeds and routing code). Nothing is formatted into code. Before it is written, the script's tiny model
is built here and saved, and compared with the suite's checkpoint tensor for tensor; the docstring says how that
came out.

A case the script cannot express (a device, user-loop or checkpoint case, fake quantization, a planted bug, mixed
precision, a resume, a vision encoder's pixel patches) skips with "cannot write a reproducer: <why>".
"""

from __future__ import annotations

import ast
import pprint
import tempfile
import textwrap
from pathlib import Path

import pytest
from checks.kinds import Check, Layout

from harness.contract import WRITE_REPRO_OPTION

DEST = "harness_write_repro"
HELP = ("write the selected test's standalone reproducer (torch and transformers only) to FILE instead of running "
        "its ranks; the test skips (harness repro)")
TEMPLATE = Path(__file__).with_name("repro_template.py")
CASE_LINE = "CASE: dict = {}"
WRITTEN = "repro written to "
REFUSED = "cannot write a reproducer: "
CASE_INDENT = " " * len("CASE = ")


# ---------------------------------------------------------------- pytest hooks (conftest.py binds them)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("harness").addoption(WRITE_REPRO_OPTION, dest=DEST, metavar="FILE", default=None, help=HELP)


def pytest_collection_finish(session: pytest.Session) -> None:
    """One script is one case: the option takes one selected test (none selected: pytest says so itself)."""
    if session.config.getoption(DEST) is not None and len(session.items) > 1:
        raise pytest.UsageError(f"{WRITE_REPRO_OPTION} writes one case's reproducer; the arguments select "
                                f"{len(session.items)} tests")


def write_if_requested(request, checkpoint, case, phases: list[tuple[int, object, tuple]]) -> None:
    """With the option: write the script of `case` (its launches: `phases`) and skip the test; else nothing."""
    path = request.config.getoption(DEST)
    if path is None:
        return
    reason = unexpressed(case, phases)
    if reason is not None:
        pytest.skip(REFUSED + reason)
    world_size = phases[0][0]
    Path(path).write_text(script(request.node.nodeid, checkpoint, case, world_size), encoding="utf-8")
    pytest.skip(WRITTEN + str(path))


# ---------------------------------------------------------------- what the script can express


def unexpressed(case, phases) -> str | None:
    """Why the script cannot express this case, or None."""
    from checks import rank_cases
    from models import families
    from training import steps

    if type(case) not in (rank_cases.Case, steps.TrainCase):
        return f"a {type(case).__name__}; the script runs rank_cases.Case and steps.TrainCase cases"
    if len(phases) != 1:
        return f"{len(phases)} launches; the script runs one"
    if families.family(case.family).inputs == "pixel_patches":
        return f"{case.family} is fed pixel patches; the script feeds token ids"
    if getattr(case, "bug", None) is not None:
        return f"a planted bug ({case.bug}), not an upstream failure"
    if isinstance(case, rank_cases.Case) and (case.quant is not None or Check.QUANTIZED in case.checks):
        return f"fake quantization ({case.quant}) is the suite's own instrument"
    if isinstance(case, steps.TrainCase) and case.resume_at is not None:
        return "a resume from a torch.distributed.checkpoint save"
    if isinstance(case, steps.TrainCase) and case.mixed_precision:
        return "FSDP2 mixed precision"
    return None


def checks_of(case) -> list[str]:
    """The checks the script runs, as plain strings: the script's CASE is written as literals (pprint)."""
    from training import steps

    if isinstance(case, steps.TrainCase):
        checks = [Check.LOAD, *(steps.ONE_STEP_CHECKS if case.one_step else ()), Check.TRAIN]
    else:
        checks = [check for check in (Check.LOAD, Check.LOGITS, Check.GRADIENTS) if check in case.checks]
    return [str(check) for check in checks]


# ---------------------------------------------------------------- the case as data


def case_data(test_id: str, checkpoint, case, world_size: int, device: str) -> dict:
    import torch
    from loading import tf_adapter
    from models import families, tiny_models

    family = families.family(case.family)
    model_class = tf_adapter.model_class(checkpoint.path)
    layout = tf_adapter.LAYOUTS[case.layout]
    whole = tf_adapter.load_whole(checkpoint.path, torch.float32, torch.device("cpu"), None, model_class)
    return {
        "test_id": test_id,
        "family": case.family,
        "model": {
            "config_class": qualified(families.config_class(family.model_type)),
            "config": plain(family.config),
            "model_class": qualified(model_class),
        },
        "weights": {"seed": tiny_models.WEIGHTS_SEED, "moe": routing_code(family, whole) if family.is_moe else None},
        "world_size": world_size,
        "device": device,
        "dtype": case.dtype,
        "layout": {"name": str(layout.name), "experts_sharded": layout.experts_sharded,
                   "fsdp_sharded": layout.fsdp_sharded, "splits_batch": layout.splits_batch},
        "load": load_arguments(case, world_size, model_class),
        "expert_stacks": list(family.expert_stack_suffixes()),
        "checks": checks_of(case),
        "inputs": family.inputs,
        "batch": {"seed": tiny_models.BATCH_SEED, "sequences": tiny_models.BATCH_SIZE,
                  "tokens": tiny_models.SEQUENCE_LENGTH, "vocab": families.VOCAB_SIZE},
        "readout": {"seed": tiny_models.READOUT_SEED, "std": families.INITIALIZER_RANGE, "vocab": families.VOCAB_SIZE,
                    "hidden": families.HIDDEN_SIZE},
        "bounds": bounds(case.dtype),
        "training": training_data(case),
    }


def qualified(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def plain(value):
    """`value` as plain literals (dicts, lists, tuples, str, numbers, bools, None); raises where it holds another."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if hasattr(value, "items"):
        return {plain(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value)
    raise TypeError(f"{type(value).__name__} is no plain literal")


def load_arguments(case, world_size: int, model_class) -> dict:
    """from_pretrained's keyword arguments for each model, as tf_adapter and the case's runner pass them."""
    from loading import tf_adapter

    implementation = {} if case.experts_implementation is None else {
        "experts_implementation": case.experts_implementation}
    eager = tf_adapter.eager_implementation(model_class)
    reference = {"dtype": case.dtype} | ({} if eager is None else {"experts_implementation": eager})
    if case.layout == Layout.FULLY_SHARD:
        # the whole model with its own forward, then torch's fully_shard (rank_cases.fully_shard_model)
        return {"whole": {"dtype": case.dtype} | implementation, "reference": reference,
                "sharded": {"dtype": case.dtype}, "fully_shard": {"layers": "model.layers"}}
    distributed = tf_adapter.distributed_config_kwargs(case.layout, world_size)
    return {"whole": {"dtype": case.dtype} | implementation, "reference": reference,
            "sharded": {"dtype": case.dtype} | implementation | {"distributed_config": distributed},
            "fully_shard": None}


def bounds(dtype: str) -> dict:
    from checks import rank_cases, tolerances

    return {"factor": tolerances.factor(dtype), "floor_ulps": tolerances.FLOOR_ULPS,
            "training_compounding": tolerances.TRAINING_COMPOUNDING, "rounding_seed": rank_cases.ROUNDING_SAMPLE_SEED}


def training_data(case) -> dict | None:
    from training import steps

    if not isinstance(case, steps.TrainCase):
        return None
    return {
        "steps": case.steps,
        "micro_batches": steps.MICRO_BATCHES,
        "adamw": {"lr": steps.LEARNING_RATE, "weight_decay": steps.WEIGHT_DECAY, "eps": steps.ADAM_EPS},
        "adamw_kernel": dict(steps.OPTIMIZER_OPTIONS[case.optimizer]),
        "warmup_steps": steps.WARMUP_STEPS,
        "max_grad_norm": steps.MAX_GRAD_NORM,
        "clip": case.clipping,
    }


def routing_code(family, model) -> dict:
    """tiny_models.build_checkpoint's steps after the model's own init, as data: where they write, read from the
    loaded checkpoint (`model`), and what (the code's values, each router's gain as calibrated)."""
    from models import families, tiny_models

    experts = families.NUM_EXPERTS
    tokens = model.get_input_embeddings().weight.shape[0]
    chosen = (tiny_models.primary_expert, tiny_models.secondary_expert)[: family.top_k]
    drawn = []
    if family.model_type in families.UNINITIALIZED_EXPERTS:
        drawn = [[f"{experts_path(family, layer)}.{name}", model.config.initializer_range]
                 for layer in family.moe_layers for name in family.expert_params]
    return {
        "experts": experts,
        "drawn": drawn,
        "content_std": tiny_models.CONTENT_STD,
        "code_values": [tiny_models.PRIMARY_CODE, tiny_models.SECONDARY_CODE][: family.top_k],
        "token_experts": [[expert(token) for expert in chosen] for token in range(tokens)],
        "small_bias": tiny_models.small_bias(experts).tolist(),
        "zero_code_rows": zero_code_rows(family, model),
        "routers": [router_data(family, model, layer) for layer in family.moe_layers],
    }


def experts_path(family, layer: int) -> str:
    return f"{family.block_path(layer)}.{family.experts}"


def zero_code_rows(family, model) -> list[list]:
    """(tensor, dimension) of every output into the residual stream whose code channels are zeroed
    (tiny_models._zero_code_outputs)."""
    import torch
    from models import families

    rows = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module.out_features == families.HIDDEN_SIZE:
            rows.append([f"{name}.weight", 0])
            if module.bias is not None:
                rows.append([f"{name}.bias", 0])
    for layer in family.moe_layers:
        experts = model.get_submodule(experts_path(family, layer))
        for name in family.expert_params:
            if not name.startswith("down_proj"):
                continue
            stack = experts.get_parameter(name)  # a stack may sit in a child (`post_expert_norm.weight`)
            # a bias [experts, hidden]; [experts, intermediate, hidden] transposed; else [experts, hidden, intermediate]
            dim = 2 if stack.dim() == 3 and getattr(experts, "is_transposed", False) else 1
            rows.append([f"{experts_path(family, layer)}.{name}", dim])
    return rows


def router_data(family, model, layer: int) -> dict:
    """One router's part of tiny_models.write_routing_code and calibrate_router_gain."""
    from models import families

    path = f"{family.block_path(layer)}.{family.router}"
    router = model.get_submodule(path)
    pass_through = []
    for mlp_layer in family.router_mlp:
        bias = router.get_submodule(mlp_layer).bias
        pass_through.append([f"{path}.{mlp_layer}.weight", None if bias is None else f"{path}.{mlp_layer}.bias"])
    name, weight, _ = families.router_weight(router)
    tables = [table_name for table_name, table in router.named_buffers()
              if not table.is_floating_point() and tuple(table.shape) == (model.get_input_embeddings().weight.shape[0],
                                                                           family.top_k)]
    biases = [extra_name for extra_name, extra in [*router.named_parameters(), *router.named_buffers()]
              if "bias" in extra_name and extra is not weight and extra.dim() == 1
              and extra.shape[0] == families.NUM_EXPERTS]
    return {
        "pass_through": pass_through,
        "weight": f"{path}.{name}",
        "gain": float(weight[0, 0]),  # the code block is gain x identity once calibrated
        "token_tables": [f"{path}.{table}" for table in tables],
        "small_biases": [f"{path}.{extra}" for extra in biases],
    }


# ---------------------------------------------------------------- the script


def script(test_id: str, checkpoint, case, world_size: int) -> str:
    from harness.ranks.plugin import RANK_UNIT_GPUS, available_ranks

    device = "cuda" if available_ranks()[1] == RANK_UNIT_GPUS else "cpu"
    data = case_data(test_id, checkpoint, case, world_size, device)
    return render(docstring(data, weights_difference(data, checkpoint.path)), data)


def render(text: str, data: dict) -> str:
    """The template with its docstring replaced by `text` and its CASE line by `data`; checked by parsing it back."""
    template = TEMPLATE.read_text(encoding="utf-8")
    lines = template.splitlines(keepends=True)
    docstring_end = ast.parse(template).body[0].end_lineno
    case_lines = [index for index, line in enumerate(lines) if line.rstrip("\n") == CASE_LINE]
    if len(case_lines) != 1:
        raise AssertionError(f"{TEMPLATE.name} must hold one line {CASE_LINE!r}, found {len(case_lines)}")
    literal = pprint.pformat(data, width=120 - len(CASE_INDENT), sort_dicts=False, compact=True)
    lines[case_lines[0]] = "CASE = " + literal.replace("\n", "\n" + CASE_INDENT) + "\n"
    written = docstring_literal(text) + "\n" + "".join(lines[docstring_end:])
    parsed = ast.parse(written)
    assigned = [node.value for node in parsed.body if isinstance(node, ast.Assign)
                and [getattr(target, "id", None) for target in node.targets] == ["CASE"]]
    if ast.get_docstring(parsed, clean=False) != text or [ast.literal_eval(value) for value in assigned] != [data]:
        raise AssertionError("the written script does not read back as its docstring and its case")
    return written


def docstring_literal(text: str) -> str:
    """`text` (ending in a newline) as a triple-quoted string literal: backslashes escaped, and every run of three
    quotes, so no text ends it early."""
    return '"""' + text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '"""'


# What each layout is, in the docstring's words.
LAYOUT_WORDS = {
    Layout.EP: "expert parallelism (transformers' DistributedConfig)",
    Layout.FSDP: "FSDP2 (transformers' DistributedConfig)",
    Layout.FSDP_EP: "FSDP2 with expert parallelism (transformers' DistributedConfig)",
    Layout.FULLY_SHARD: "torch's fully_shard on each decoder layer and the root of the whole model",
}


def docstring(data: dict, weights: str | None) -> str:
    """What the script reproduces, written for which releases and commit, what it checks and how to run it."""
    import torch
    import transformers

    load, backend = data["load"], "nccl" if data["device"] == "cuda" else "gloo"
    weights_words = ("identical to the suite's tiny checkpoint, tensor for tensor (compared when written)"
                     if weights is None else f"NOT the suite's tiny checkpoint: {weights}")
    paragraphs = [
        f"Reproduces {data['test_id']} of the harness suite (tests/gpu), standalone: torch and transformers only.",
        f"Written for transformers {transformers.__version__} and torch {torch.__version__}, harness commit "
        f"{harness_commit()}.",
        f"The case: {data['family']} loaded with {LAYOUT_WORDS[data['layout']['name']]} on {data['world_size']} ranks "
        f"({data['device']}, {backend}), {data['dtype']}: {data['model']['model_class']}.from_pretrained(path, "
        f"**{load['sharded']})" + (", its distributed_config a DistributedConfig of that dict." if load["fully_shard"]
                                   is None else ", then fully_shard."),
        f"Checks, in order: {', '.join(data['checks'])}. Each measures the sharded model against the whole model in "
        f"float64 (from_pretrained(path, **{load['reference']}), cast): it may be at most "
        f"{data['bounds']['factor']:g} times farther from it than the whole model (**{load['whole']}) is, as in "
        "the suite.",
        f"The tiny model: the config's own init under torch.manual_seed({data['weights']['seed']}), then (an MoE) the "
        "suite's routing code, so every router decides clearly: token t goes to the experts "
        "CASE['weights']['moe']['token_experts'][t] in every MoE layer. Its weights: " + weights_words + ".",
        "Run: python THIS_FILE [--traceback]  (nothing of the harness needs to be importable). Exit status 1 and the "
        "failing rank's exception (its type, its first line, where it was raised) when the failure reproduces; 0 "
        "and 'no failure' otherwise.",
    ]
    return "\n\n".join(textwrap.fill(paragraph, width=116, break_long_words=False, break_on_hyphens=False)
                       for paragraph in paragraphs) + "\n"


def harness_commit() -> str:
    from harness.project import git

    here = Path(__file__).parent
    commit = (git(here, "rev-parse", "HEAD") or "").strip()
    if not commit:
        return "unknown (no git checkout)"
    changed = (git(here, "status", "--porcelain", "--untracked-files=no") or "").strip()
    return f"{commit} with uncommitted changes" if changed else commit


def weights_difference(data: dict, checkpoint_path: str) -> str | None:
    """How the script's tiny model differs from the suite's checkpoint (both saved by save_pretrained), or None."""
    import torch

    from upstream import repro_template

    with tempfile.TemporaryDirectory(prefix="repro-weights-") as folder:
        repro_template.build_model(data).save_pretrained(folder)
        rebuilt, suites = saved_tensors(Path(folder)), saved_tensors(Path(checkpoint_path))
    if rebuilt.keys() != suites.keys():
        return (f"other tensors: missing {sorted(suites.keys() - rebuilt.keys())[:3]}, extra "
                f"{sorted(rebuilt.keys() - suites.keys())[:3]}")
    differing = [name for name in suites if not torch.equal(rebuilt[name], suites[name])]
    if not differing:
        return None
    first = differing[0]
    largest = (rebuilt[first].double() - suites[first].double()).abs().max().item() \
        if rebuilt[first].shape == suites[first].shape else "another shape"
    return f"{len(differing)} of {len(suites)} tensors differ, {first} first (largest difference {largest})"


def saved_tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors
