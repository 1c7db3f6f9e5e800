"""What every rank runs: load the whole model and a sharded one, then compare them.

`run_case(checkpoint, case)` is the one function the tests hand to the `ranks` fixture. A `Case` is
plain picklable data, so a persistent rank pool can run it as well as a fresh spawn. On every rank:

1. the reference: the whole model from the same checkpoint, on this rank's device;
2. the sharded model: transformers' own distributed loading (loading/tf_adapter.py) or torch's fully_shard;
3. the checks the case asks for, in this order, each raising with a message that says what differs:
   load (each rank holds its share, the rest whole) -> logits -> quantized weights -> routing -> gradients
   (routing is checked in every training step of the MoE, before its gradients).

It returns the case's metrics (largest gradient error, its bound, smallest routing margin, ...), which
the tests record as JUnit properties. Each rank also writes them to `metrics_dir` on every exit path, so a
failing check's measurements (the worst case of all) still reach the report.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from loading import tf_adapter
from loading.float64_mode import stay_float64

# With every rank function's module, not at a switched family's first case: a module first imported during a rank's
# call retires the rank pool (families.variant_config_kwargs reads it).
from models import (
    config_switches,  # noqa: F401
    families,
    tiny_models,
)
from torch.distributed.tensor import DTensor

from checks import fake_quant, planted, routing, tolerances, verdicts
from checks.case import SuiteCase
from checks.kinds import Check, Layout
from checks.tensors import full, local
from harness import contract
from harness.ranks import together

# Imported with this module (every rank function's): torch's record_function imports it at its first use during a
# call (FSDP2's and DCP's steps), and a module first imported during a call makes the rank pool replace its ranks.
with contextlib.suppress(ImportError):
    import torch.profiler._cupti_monitor

WORLD_SIZES = (2, 4, 8)
DTYPES = ("float32", "bfloat16")
# in the order they run; "quantized" (the sharded model computed with the whole model's quantized weights)
# needs a `quant` recipe, and runs in the training step before routing and gradients
CHECKS = (Check.LOAD, Check.LOGITS, Check.QUANTIZED, Check.GRADIENTS)


@dataclass(frozen=True)
class Case(SuiteCase):
    """The one-step checks of a sharded load against the whole model; a planted bug acts on the last rank."""

    checks: tuple[Check, ...]
    quant: str | None = None  # a fake_quant recipe, applied in the gradient check
    quant_scope: str = "per_expert"  # how the sharded model computes its nvfp4 global scale

    BUGS = planted.ONE_STEP_BUGS

    @property
    def planted_defect(self) -> str | None:
        """The defect this case plants on purpose (a deliberate-bug or negative test), if any."""
        if self.bug is not None:
            return self.bug
        return None if self.quant_scope == "per_expert" else f"{self.quant} scale over the {self.quant_scope}"

    def __post_init__(self):
        super().__post_init__()
        if unknown := set(self.checks) - set(CHECKS):
            raise ValueError(f"unknown checks {sorted(map(str, unknown))}; known: {tuple(map(str, CHECKS))}")
        if Check.QUANTIZED in self.checks and self.quant is None:
            raise ValueError("the quantized check needs a quant recipe")


def run_case(checkpoint: str, case: Case, metrics_dir: str | None = None, model_class: type | None = None) -> dict:
    """`model_class` (tf_adapter.model_class, resolved by the caller) travels by reference: unpickling the call
    imports its modeling module, so the rank pool sees that import as part of a fresh rank's state, not as a
    module first imported during the call (which would retire the pool at every new family)."""
    metrics = case_metrics(case)
    if case.planted_defect is not None:
        metrics[contract.PLANTED_DEFECT] = case.planted_defect
    return measured(metrics, metrics_dir, lambda into: _run_checks(checkpoint, case, into, model_class))


def case_metrics(case) -> dict:
    """What names a case in its metrics (the family is recorded by the suite's run_case before the launch)."""
    return {
        contract.CASE_LAYOUT: str(case.layout),  # the plain name, in results as in the rank's json
        contract.CASE_DTYPE: case.dtype,
        contract.CASE_EXPERTS_IMPLEMENTATION: case.experts_implementation or "default",
    }


def measured(metrics: dict, metrics_dir: str | None, compare) -> dict:
    """`compare(metrics)` adds what it measures; this rank writes the metrics to `metrics_dir` on every exit path,
    so a failing check's measurements still reach the report."""
    try:
        compare(metrics)
    finally:
        if metrics_dir is not None:
            Path(metrics_dir, f"rank{dist.get_rank()}.json").write_text(json.dumps(metrics))
    return metrics


def read_metrics(metrics_dir: str) -> list[dict]:
    """What each rank wrote to `metrics_dir` (those that got as far as writing), in rank order."""
    paths = sorted(Path(metrics_dir).glob("rank*.json"), key=lambda path: int(path.stem[4:]))
    return [json.loads(path.read_text()) for path in paths]


def _run_checks(checkpoint: str, case: Case, metrics: dict, model_class: type | None = None) -> None:
    """The case's checks in order; each adds what it measured to `metrics` before it can raise."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    dtype = getattr(torch, case.dtype)
    layout = tf_adapter.LAYOUTS[case.layout]
    family = families.family(case.family)

    whole = tf_adapter.load_whole(checkpoint, dtype, device, case.experts_implementation, model_class)
    loaded = tf_adapter.Loaded(whole, dtype, case.experts_implementation)  # copied below before anything runs on it
    # The ground truth every bound is measured against (checks/tolerances.py): the whole model in float64.
    reference = tf_adapter.load_reference(checkpoint, dtype, device, model_class, loaded)
    if case.layout == Layout.FULLY_SHARD:
        sharded = fully_shard_model(
            tf_adapter.whole_as_loaded(loaded, checkpoint, dtype, device, None, model_class), world_size, device
        )
    else:
        sharded = tf_adapter.load_sharded(
            checkpoint, case.layout, world_size, dtype, case.experts_implementation, model_class
        )
    if case.bug in planted.LOAD_BUGS and rank == world_size - 1:
        planted.plant_bug(sharded, family, case.bug)

    # A check that fails on one rank fails on all (together): its peers would wait in the next collective.
    if Check.LOAD in case.checks:
        with together("the load check"):
            check_load(sharded, whole, family, layout, rank, world_size)
    check_one_step(Models(sharded=sharded, whole=whole, reference=reference), family, case, layout, metrics)


def check_one_step(models: Models, family: families.Family, case: Case, layout: tf_adapter.LayoutTraits,
                   metrics: dict) -> None:
    """The checks of one forward and backward that `case` asks for, in order: logits, then (training mode) the
    quantized weights, routing and gradients. The training layer runs them on the models it then trains, so one
    load serves both; it clears their gradients after."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batch = tiny_models.make_batch().to(rank_device())
    rows = batch_rows(layout, rank, world_size)
    if Check.LOGITS in case.checks:
        with torch.no_grad():
            sharded_logits = model_logits(models.sharded, batch[rows])
            whole_logits = model_logits(models.whole, batch)[rows]
            with stay_float64():
                reference_logits = model_logits(models.reference, batch)[rows]
        compare_logits(sharded_logits, whole_logits, reference_logits, case.dtype, metrics)
    if Check.QUANTIZED in case.checks or Check.GRADIENTS in case.checks:
        compare_training_step(models, family, case, layout, batch, rank, world_size, metrics)


def compare_logits(
    sharded: torch.Tensor, whole: torch.Tensor, reference: torch.Tensor, dtype_name: str, metrics: dict
) -> None:
    """The sharded logits within the stated multiple of the whole model's own distance from float64."""
    whole_difference = verdicts.largest_difference(whole, reference)
    scale = reference.abs().max().item() if reference.numel() else 0.0
    bound = tolerances.logits_bound(dtype_name, whole_difference, scale)
    metrics[contract.LOGITS_DIFFERENCE] = verdicts.largest_difference(sharded, reference)
    metrics[contract.LOGITS_ATOL] = bound  # the bound, beside it
    metrics[contract.WHOLE_LOGITS_DIFFERENCE] = whole_difference
    with together("the logits check"):
        verdicts.check_close_to_reference("logits", sharded, reference, bound=bound, whole_difference=whole_difference)


def rank_device() -> torch.device:
    """This rank's device: its GPU under NCCL (with TF32 off), else the CPU."""
    if dist.get_backend() != "nccl":
        return torch.device("cpu")
    # float32 means float32: TF32 matmuls would put 1e-3 of noise under a 1e-6 bound
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch.device("cuda", torch.cuda.current_device())


def fully_shard_model(model, world_size: int, device: torch.device, mp_policy=None):
    """torch's FSDP2 applied directly: each decoder layer, then the root (with `mp_policy`, a MixedPrecisionPolicy,
    where given)."""
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6 kept it private
        from torch.distributed._composable.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (world_size,))
    policy = {} if mp_policy is None else {"mp_policy": mp_policy}
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, **policy)
    fully_shard(model, mesh=mesh, **policy)
    return model


def batch_rows(layout: tf_adapter.LayoutTraits, rank: int, world_size: int) -> slice:
    """The sequences of the batch this rank feeds: its own share when the layout is data parallel."""
    return share_rows(rank, world_size) if layout.splits_batch else slice(None)


def share_rows(rank: int, world_size: int) -> slice:
    """Rank `rank`'s 1/world of the batch's sequences."""
    per_rank = tiny_models.BATCH_SIZE // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def expert_share(stack: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """The contiguous 1/world of an expert stack that expert parallelism gives `rank`."""
    count = stack.shape[0] // world_size
    return stack[rank * count : (rank + 1) * count]


# ---------------------------------------------------------------- load


def check_load(sharded, whole, family: families.Family, layout: tf_adapter.LayoutTraits, rank: int,
               world_size: int) -> None:
    """Each rank holds its share (a contiguous 1/world of the experts; its FSDP chunk), the rest whole:
    parameters (weights and biases) and buffers (a router's correction bias, say)."""
    whole_params = dict(whole.named_parameters())
    sharded_params = dict(sharded.named_parameters())
    if sharded_params.keys() != whole_params.keys():
        raise AssertionError(
            f"the sharded model's parameters differ from the whole model's: missing "
            f"{sorted(whole_params.keys() - sharded_params.keys())}, extra "
            f"{sorted(sharded_params.keys() - whole_params.keys())}"
        )
    problems = []
    for name, param in sharded_params.items():
        expected = whole_params[name].detach()
        if layout.experts_sharded and family.is_expert_stack(name):
            # Expert shares are disjoint and cover every expert, so the local check on each rank is the
            # complete check, and it names the rank and the expert.
            problems += _expert_share_problems(name, local(param).detach(), expected, rank, world_size)
            continue
        if layout.fsdp_sharded and isinstance(param, DTensor):
            expected_chunk = dtensor_share(expected, param)
            if not torch.equal(local(param).detach(), expected_chunk):
                problems.append(
                    f"rank {rank}'s FSDP shard of {name} is not its share of the whole model's "
                    f"({_placement_words(param)})"
                )
        if not isinstance(param, DTensor) and param.shape != expected.shape:
            # a plain local tensor of a shard's shape: a TP shard the plan made without a DTensor (gemma4_text's
            # dense MLP under its 5.6-5.7 EP plan); compare it with that chunk of the whole model's
            problems += _plain_tp_share_problems(name, param.detach(), expected, plan_style(sharded, name), rank,
                                                 world_size)
            continue
        gathered = full(param.detach())
        if gathered.shape != expected.shape or not torch.equal(gathered, expected):
            problems.append(
                f"rank {rank}'s {name} differs from the whole model's after loading "
                f"(largest difference {_largest_difference(gathered, expected)})"
            )
    problems += _buffer_problems(sharded, whole, rank)
    if problems:
        raise AssertionError("load: " + "; ".join(problems))


def dtensor_share(whole: torch.Tensor, sharded: DTensor) -> torch.Tensor:
    """The part of `whole` that `sharded`'s placements give this rank: torch.chunk along each sharded dimension,
    over that mesh dimension's size, at this rank's coordinate (a parameter FSDP shards over a smaller mesh than
    the world, as one inside an expert-parallel module, has its own)."""
    from torch.distributed.tensor import Shard

    share = whole
    coordinate = sharded.device_mesh.get_coordinate()
    if coordinate is None:  # a DTensor on a mesh this rank is not in: it holds no share of it
        raise ValueError("this rank holds no share of a DTensor on a mesh it is not in")
    for mesh_dim, placement in enumerate(sharded.placements):
        if isinstance(placement, Shard):
            chunks = share.chunk(sharded.device_mesh.size(mesh_dim), dim=placement.dim)
            index = coordinate[mesh_dim]
            share = chunks[index] if index < len(chunks) else share.narrow(placement.dim, 0, 0)
    return share


# A plain-tensor TP shard's dimension per plan style, by the parameter's number of dimensions (transformers'
# ColwiseParallel / RowwiseParallel.shard_tensor): colwise shards a weight's output features (dim -2) and a bias's
# only dim; rowwise a weight's input features (dim -1) and leaves a bias whole. Packed (fused gate/up) styles
# interleave their chunks and are not read here.
TP_SHARD_DIMS = {"colwise": {1: -1, 2: -2}, "rowwise": {2: -1}}


def plan_style(model, name: str) -> str | None:
    """The sharding style the model's EP plan (as transformers keeps it on the loaded model: `_ep_plan`) gives
    parameter `name`: its own key or its module's, layer numbers read as `*`; None where the plan names neither."""
    plan = getattr(model, "_ep_plan", None) or {}
    generic = re.sub(r"\.\d+\.", ".*.", name)
    for key in (generic, generic.rsplit(".", 1)[0]):
        if key in plan:
            return plan[key]
    return None


def is_plain_tp_shard(model, name: str, param: torch.Tensor) -> bool:
    """Whether this rank holds `name` as a plain tensor that the plan's style shards (a TP shard made without a
    DTensor, gemma4_text's dense MLP under its 5.6-5.16 EP plan), not the whole parameter."""
    if isinstance(param, DTensor):
        return False
    style = (plan_style(model, name) or "").removeprefix("local_")
    return param.dim() in TP_SHARD_DIMS.get(style, {})


def tp_share(model, name: str, whole: torch.Tensor | None) -> torch.Tensor | None:
    """The chunk of the whole model's `whole` (a weight, a gradient) that this rank's plain TP shard of `name`
    holds."""
    if whole is None:
        return None
    return tp_chunk(whole, plan_style(model, name), dist.get_rank(), dist.get_world_size())


def tp_chunk(whole: torch.Tensor, style: str | None, rank: int, world_size: int) -> torch.Tensor | None:
    """The chunk of `whole` that a TP `style` gives `rank` of `world_size` (torch.chunk along the style's dimension,
    as DTensor's Shard: ceil(size / world) each, a trailing rank empty); None where the style shards no dimension
    of a tensor of this rank (a packed style, a rowwise bias, no style)."""
    style = (style or "").removeprefix("local_")
    dim = TP_SHARD_DIMS.get(style, {}).get(whole.dim())
    if dim is None:
        return None
    chunks = whole.chunk(world_size, dim=dim)
    return chunks[rank] if rank < len(chunks) else whole.narrow(dim, 0, 0)


def _plain_tp_share_problems(
    name: str, mine: torch.Tensor, expected: torch.Tensor, style: str | None, rank: int, world_size: int
) -> list[str]:
    """A plain tensor whose shape is not the whole parameter's: it must be this rank's TP chunk by the plan's style,
    bit for bit."""
    chunk = tp_chunk(expected, style, rank, world_size)
    if chunk is None:
        return [
            f"rank {rank}'s {name} differs from the whole model's after loading (a plain tensor of shape "
            f"{tuple(mine.shape)}, not a TP shard the plan makes: style {style!r}, whole {tuple(expected.shape)})"
        ]
    if mine.shape != chunk.shape or not torch.equal(mine, chunk):
        return [
            f"rank {rank}'s TP shard of {name} is not its {style} chunk of the whole model's "
            f"({tuple(chunk.shape)} of {tuple(expected.shape)} over {world_size} ranks; largest difference "
            f"{_largest_difference(mine, chunk)})"
        ]
    return []


def _placement_words(param: DTensor) -> str:
    return f"placements {tuple(param.placements)} over mesh {tuple(param.device_mesh.shape)}"


def _buffer_problems(sharded, whole, rank: int) -> list[str]:
    whole_buffers = dict(whole.named_buffers())
    problems = []
    for name, buffer in sharded.named_buffers():
        expected = whole_buffers.get(name)
        if expected is None:
            problems.append(f"rank {rank}'s sharded model has a buffer {name} the whole model has not")
            continue
        mine = full(buffer)
        if mine.shape != expected.shape or not torch.equal(mine, expected):
            problems.append(
                f"rank {rank}'s buffer {name} differs from the whole model's after loading "
                f"(largest difference {_largest_difference(mine, expected)})"
            )
    return problems


def _expert_share_problems(
    name: str, local_stack: torch.Tensor, expected: torch.Tensor, rank: int, world_size: int
) -> list[str]:
    num_experts = expected.shape[0]
    count = num_experts // world_size
    first = rank * count
    if local_stack.shape[0] != count:
        return [
            f"rank {rank} holds {local_stack.shape[0]} experts of {name}, expected {count} "
            f"(1/{world_size} of {num_experts})"
        ]
    differing = verdicts.differing_experts(local_stack, expert_share(expected, rank, world_size), first)
    return [verdicts.expert_shard_message(rank, name, first, count, differing)] if differing else []


def _largest_difference(actual: torch.Tensor, expected: torch.Tensor) -> str:
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    return f"{(actual.float() - expected.float()).abs().max().item():.3g}"


# ---------------------------------------------------------------- training step


def model_logits(model, batch: torch.Tensor) -> torch.Tensor:
    """The model's logits, whole; a base model without an LM head (a VL model's text part) has its last hidden
    states scored by tiny_models.readout, a fixed matrix that is no parameter (so no sharding touches it). The token
    ids reach the model as its family takes them (tiny_models.model_inputs: ids, embeddings, pixel patches)."""
    output = tiny_models.run_model(model, batch)
    logits = getattr(output, "logits", None)
    if logits is not None:
        return full(logits)
    hidden = full(tiny_models.token_states(model, output, batch))
    return hidden @ tiny_models.readout(hidden.dtype, hidden.device).T


def next_token_loss(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch[:, 1:].flatten())


@dataclass(frozen=True)
class Models:
    """The three models a case compares: the one under test, the whole model in the same dtype (the rounding a
    correct run has on this machine) and the whole model in float64 (the truth both are measured against)."""

    sharded: torch.nn.Module
    whole: torch.nn.Module
    reference: torch.nn.Module


def compare_training_step(
    models: Models,
    family: families.Family,
    case: Case,
    layout: tf_adapter.LayoutTraits,
    batch: torch.Tensor,
    rank: int,
    world_size: int,
    metrics: dict,
) -> None:
    sharded, whole, reference = models.sharded, models.whole, models.reference
    if case.quant is not None:
        whole_quantizer = fake_quant.FakeQuantizer(case.quant, "per_expert")
        sharded_quantizer = fake_quant.FakeQuantizer(case.quant, case.quant_scope)
        # the reference computes with the same quantized values (quantized in float32, then cast up)
        reference_quantizer = fake_quant.FakeQuantizer(case.quant, "per_expert")
        attach = fake_quant.attach_to_experts if family.is_moe else fake_quant.attach_to_dense_mlps
        if not all(attach(*pair) for pair in ((whole, whole_quantizer), (sharded, sharded_quantizer),
                                              (reference, reference_quantizer))):
            raise AssertionError(f"found no weights to fake-quantize in {type(whole).__name__}")
    for model in (sharded, whole, reference):
        model.train()
    # A second sample of the whole model's rounding, before the routing recorders listen (checks/tolerances.py)
    other_order = gradients_in_another_order(whole, batch) if Check.GRADIENTS in case.checks else None
    # The recorders listen for this step only: a model that trains on must not record every later forward.
    rows = batch_rows(layout, rank, world_size)
    # The whole models' losses are averaged the way the ranks' losses are: over the ranks' shares of the batch.
    shares = (
        [batch_rows(layout, other, world_size) for other in range(world_size)] if layout.splits_batch else [slice(None)]
    )
    with contextlib.ExitStack() as listening:
        if family.is_moe:
            whole_routing = listening.enter_context(routing.RoutingRecorder(whole, family))
            sharded_routing = listening.enter_context(routing.RoutingRecorder(sharded, family))

        def whole_loss(model) -> torch.Tensor:
            logits = model_logits(model, batch)
            total = sum(next_token_loss(logits[share], batch[share]) for share in shares)
            return cast(torch.Tensor, total) / len(shares)

        with stay_float64():
            reference_loss = whole_loss(reference)
        whole_losses = (whole_loss(whole), reference_loss)
        sharded_loss = next_token_loss(model_logits(sharded, batch[rows]), batch[rows])

        if Check.QUANTIZED in case.checks:
            with together("the quantized weights check"):
                check_quantized_weights(sharded_quantizer, whole_quantizer, family, layout, rank, world_size)
        if family.is_moe:
            # Routing first: a flipped route shows as a large gradient error, but the route is the cause.
            tokens = _token_rows(rows, batch.shape[1])
            if sharded_routing.layers:
                metrics[contract.ROUTING_MARGIN] = min(layer.margin for layer in sharded_routing.layers)
            with together("the routing check"):
                verdicts.check_routing(sharded_routing.layers, whole_routing.rows(tokens))
        if Check.GRADIENTS not in case.checks:
            return

        for loss in (*whole_losses, sharded_loss):
            loss.backward()
        if case.bug in planted.GRADIENT_BUGS and rank == world_size - 1:
            planted.plant_gradient_bug(sharded, family, case.bug)
        assert other_order is not None  # sampled above whenever the gradients check runs
        compare_gradients(models, other_order, family, case, layout, rank, world_size, metrics)


def gradients_in_another_order(model, batch: torch.Tensor) -> dict[str, torch.Tensor | None]:
    """A second sample of the model's rounding: the same loss with the batch's sequences in reverse order (every sum
    over tokens runs in another order; the mean loss is the same number in real arithmetic, the ranks' shares being
    equal in size), and every leaf module's output moved by up to one unit in the last place (the activations'
    rounding, which a sharded model's other order of partial sums changes too). Sensitive quantities, such as a
    gradient that cancels, show their sensitivity here even where the first sample was lucky. The model's gradients
    are cleared again."""
    reversed_batch = batch.flip(0)
    with perturbed_rounding(model):
        next_token_loss(model_logits(model, reversed_batch), reversed_batch).backward()
    gradients = {
        name: None if param.grad is None else param.grad.detach().clone() for name, param in model.named_parameters()
    }
    model.zero_grad(set_to_none=True)
    return gradients


ROUNDING_SAMPLE_SEED = 29


@contextlib.contextmanager
def perturbed_rounding(model):
    """Every leaf module's floating output times (1 + e), e uniform in [-ulp, ulp] of its dtype (fixed seed)."""
    generator = torch.Generator().manual_seed(ROUNDING_SAMPLE_SEED)

    def perturb(module, args, output):
        if not isinstance(output, torch.Tensor) or not output.is_floating_point() or isinstance(output, DTensor):
            return None
        noise = torch.rand(output.shape, generator=generator, dtype=torch.float64) * 2 - 1
        scale = 1 + noise.to(output.device) * torch.finfo(output.dtype).eps
        return output * scale.to(output.dtype)

    handles = [module.register_forward_hook(perturb) for module in model.modules() if not any(module.children())]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def compare_gradients(
    models: Models,
    other_order: dict[str, torch.Tensor | None],
    family: families.Family,
    case: Case,
    layout: tf_adapter.LayoutTraits,
    rank: int,
    world_size: int,
    metrics: dict,
) -> None:
    """Each parameter's sharded gradient within the stated multiple of the whole model's own error, both
    against float64 (norm-wise over the parameter: checks/tolerances.py)."""
    sharded_grads, whole_grads, reference_grads, other_order_grads = {}, {}, {}, {}
    named = zip(
        models.sharded.named_parameters(),
        models.whole.named_parameters(),
        models.reference.named_parameters(),
        strict=True,
    )
    for (name, mine), (_, theirs), (_, truth) in named:
        if layout.experts_sharded and family.is_expert_stack(name):
            # Each rank compares the gradients of its own experts (some releases keep them as plain local
            # tensors, with nothing to gather); the ranks' shares together cover every expert.
            sharded_grads[name] = None if mine.grad is None else local(mine.grad)
            whole_grads[name] = None if theirs.grad is None else expert_share(theirs.grad, rank, world_size)
            reference_grads[name] = None if truth.grad is None else expert_share(truth.grad, rank, world_size)
            other = other_order[name]
            other_order_grads[name] = None if other is None else expert_share(other, rank, world_size)
        elif mine.shape != theirs.shape and is_plain_tp_shard(models.sharded, name, mine):
            # this rank's TP chunk, with the same chunk of the whole model's gradients
            sharded_grads[name] = None if mine.grad is None else mine.grad
            whole_grads[name] = tp_share(models.sharded, name, theirs.grad)
            reference_grads[name] = tp_share(models.sharded, name, truth.grad)
            other_order_grads[name] = tp_share(models.sharded, name, other_order[name])
        else:
            sharded_grads[name] = None if mine.grad is None else full(mine.grad)
            whole_grads[name] = theirs.grad
            reference_grads[name] = truth.grad
            other_order_grads[name] = other_order[name]
    check_gradients_against_reference(
        sharded_grads, (whole_grads, other_order_grads), reference_grads, case.dtype, metrics
    )


def check_gradients_against_reference(
    grads: dict[str, torch.Tensor | None],
    whole_samples: tuple[dict[str, torch.Tensor | None], ...],
    reference_grads: dict[str, torch.Tensor | None],
    dtype_name: str,
    metrics: dict,
) -> None:
    """Each parameter's gradient within the stated multiple of the whole model's own error (the larger of its
    samples: the same model summing in two orders), all against the float64 reference; the worst one against its
    bound goes into `metrics` before the check can raise."""
    errors = verdicts.gradient_errors(grads, reference_grads)
    sampled = [verdicts.gradient_errors(sample, reference_grads) for sample in whole_samples]
    whole_errors = {name: largest(sample[name] for sample in sampled) for name in errors}
    bounds = {name: tolerances.gradient_bound(dtype_name, whole_errors[name]) for name in errors}
    worst = verdicts.worst_parameter(errors, bounds)
    metrics.update(
        {
            contract.GRAD_ERROR: errors[worst],
            contract.GRAD_ERROR_PARAM: worst,
            contract.GRAD_BOUND: bounds[worst],
            contract.WHOLE_GRAD_ERROR: whole_errors[worst],
        }
    )
    notes = verdicts.gradient_notes(grads, reference_grads, errors, bounds)
    with together("the gradient check"):
        verdicts.check_gradients(errors, bounds, notes)


def largest(values) -> float:
    """The largest value, NaN if any is NaN."""
    values = list(values)
    return math.nan if any(math.isnan(value) for value in values) else max(values)


def _token_rows(sequences: slice, sequence_length: int) -> slice:
    if sequences == slice(None):
        return sequences
    return slice(sequences.start * sequence_length, sequences.stop * sequence_length)


def check_quantized_weights(
    sharded: fake_quant.FakeQuantizer,
    whole: fake_quant.FakeQuantizer,
    family: families.Family,
    layout: tf_adapter.LayoutTraits,
    rank: int,
    world_size: int,
) -> None:
    """The sharded model computed with exactly the whole model's quantized weights (its share of them)."""
    if sharded.quantized.keys() != whole.quantized.keys():
        raise AssertionError(
            f"fake quantization ran on {sorted(sharded.quantized)} in the sharded model but "
            f"{sorted(whole.quantized)} in the whole model"
        )
    problems = []
    for (module_name, param_name), mine in sharded.quantized.items():
        expected = whole.quantized[(module_name, param_name)]
        name = f"{module_name}.{param_name}"
        first = 0
        if layout.experts_sharded and family.is_expert_stack(name):
            first = rank * (expected.shape[0] // world_size)
            expected = expert_share(expected, rank, world_size)
        if mine.shape != expected.shape:
            problems.append(
                f"rank {rank} quantized {name} with shape {tuple(mine.shape)}, expected {tuple(expected.shape)}"
            )
        elif family.is_expert_stack(name):
            differing = verdicts.differing_experts(mine, expected, first)
            if differing:
                listed = ", ".join(str(expert) for expert, _, _ in differing)
                problems.append(
                    f"rank {rank}'s {sharded.recipe}-quantized {name} differs from the whole "
                    f"model's for experts {listed} (a scale must depend on its expert alone)"
                )
        elif not torch.equal(mine, expected):
            problems.append(
                f"rank {rank}'s {sharded.recipe}-quantized {name} differs from the whole model's "
                f"(largest difference {_largest_difference(mine, expected)})"
            )
    if problems:
        raise AssertionError("quantized weights differ: " + "; ".join(problems))


# An error, its bound, and what else was measured beside it on the same rank: summarize takes them together from
# the rank whose error is largest against its bound (each rank's bound is its own measurement).
MEASURED_AGAINST_BOUND = (
    (contract.GRAD_ERROR, contract.GRAD_BOUND, (contract.GRAD_ERROR_PARAM, contract.WHOLE_GRAD_ERROR)),
    (contract.LOGITS_DIFFERENCE, contract.LOGITS_ATOL, (contract.WHOLE_LOGITS_DIFFERENCE,)),
    (contract.PARAM_ERROR, contract.PARAM_BOUND, (contract.PARAM_ERROR_PARAM,)),
)


def summarize(values: list[dict]) -> dict:
    """One set of metrics from every rank's: each error with its bound from the rank where it is largest against
    that bound (NaN counts as the largest), the smallest `min_*`, and the others from the lowest rank that has
    them."""
    summary = {}
    for value in reversed(values):  # rank 0's values last, so they win
        summary.update(value)
    for error, bound, beside in MEASURED_AGAINST_BOUND:
        measured = [value for value in values if isinstance(value.get(error), (int, float))]
        if measured:
            worst = max(measured, key=lambda value: _ratio_to_bound(value[error], value.get(bound)))
            summary.update({name: worst[name] for name in (error, bound, *beside) if name in worst})
    for name in list(summary):
        numbered = [value for value in values if isinstance(value.get(name), (int, float))]
        if name.startswith(contract.MINIMUM_PREFIX) and numbered:
            summary[name] = min(value[name] for value in numbered)
    return summary


def _ratio_to_bound(error: float, bound: float | None) -> float:
    if math.isnan(error):
        return math.inf
    if not isinstance(bound, (int, float)) or bound <= 0:
        return error
    return error / bound

