"""What every rank runs for a training case: the same N-step loop, written as users write it, on the sharded
model and on the whole model (and on the float64 truth), compared after every step.

One step, on each model:

    for micro_batch in the step's 2 micro-batches:       # gradient accumulation
        (loss(micro_batch) / 2).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()                                      # torch.optim.AdamW (default, foreach=False or fused)
    scheduler.step()                                      # linear warm-up over WARMUP_STEPS, then constant
    optimizer.zero_grad()

After loading, the load check (rank_cases.check_load). Per step the sharded run's loss, accumulated gradients,
global gradient norm and updated parameters are measured against the float64 run and must stay within the bounds
the whole model's own runs set (tolerances.py, the same rule as the load and gradient checks: the whole model
trained twice, as it is and summed in another order with every leaf output moved by up to an ulp, the larger
error counting), and every parameter the layout replicates must be bit-identical on every rank. A failure
names the step and the check: `step 2: parameter model.norm.weight differs across ranks (rank 1 vs rank 0: ...)`.

A resume case saves model, optimizer and scheduler with torch.distributed.checkpoint after step `resume_at`,
loads them into a freshly loaded sharded model, and continues: the rest must match the uninterrupted whole run.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path

import checks
import families
import rank_cases
import tf_adapter
import tiny_models
import tolerances
import torch
import torch.distributed as dist
from float64_mode import stay_float64
from rank_cases import full, local
from torch.distributed.tensor import DTensor, Partial, Shard

from harness import contract
from harness.ranks import together

# AdamW's keyword arguments per case variant: torch's default kernels (foreach where every parameter is on a
# device that has them), the plain loop, the fused kernel
OPTIMIZER_OPTIONS = {"default": {}, "foreach_off": {"foreach": False}, "fused": {"fused": True}}
OPTIMIZERS = tuple(OPTIMIZER_OPTIONS)
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01
# At the first step AdamW's update is lr * g / (|g| + eps): with torch's default eps (1e-8) that is lr * sign(g) for
# every gradient element above 1e-8, so an element whose gradient is rounding noise gets +-lr by the noise's sign
# and the parameter check compares coin flips (gpt_oss, EP, bfloat16: q_proj.bias 0.186 against a bound of 0.125
# at eps 1e-8). At 1e-6 the update is continuous in such gradients; every larger one still moves by about lr.
ADAM_EPS = 1e-6
WARMUP_STEPS = 2
# Below the tiny models' global gradient norm (about 3-40 at the first step), so clipping scales every step.
MAX_GRAD_NORM = 1.0
MICRO_BATCHES = 2
# deliberate bugs, planted on the last rank: the update of one replicated parameter skipped at step 2; the
# optimizer state of the step before `resume_at` loaded on resume instead of its own
TRAINING_BUGS = ("skip_replicated_update", "stale_optimizer_state")
BUG_STEP = 2


@dataclass(frozen=True)
class TrainCase:
    family: str  # a key of families.FAMILIES
    layout: str  # a key of tf_adapter.LAYOUTS
    dtype: str = "float32"
    steps: int = 3
    optimizer: str = "default"  # how AdamW runs: torch's default kernels, foreach=False, or fused=True
    experts_implementation: str | None = None
    resume_at: int | None = None  # save after this step, load into a fresh sharded model, continue
    # "per_mesh" where the layout puts parameters on several device meshes (EP, FSDP2+EP), else torch's
    # clip_grad_norm_; "torch" asks for clip_grad_norm_ on any layout (the case that shows it cannot span meshes)
    clip: str | None = None
    bug: str | None = None

    @property
    def planted_defect(self) -> str | None:
        return self.bug

    @property
    def clipping(self) -> str:
        if self.clip is not None:
            return self.clip
        return "per_mesh" if tf_adapter.LAYOUTS[self.layout].experts_sharded else "torch"

    @property
    def checks(self) -> tuple[str, ...]:
        """What a training case runs, for the known-bugs table: it loads (and checks the load), trains, and clips
        with torch's clip_grad_norm_ where it asks to. An entry for the one-step logits or gradient checks does not
        cover it: its failures read otherwise ("step K: ...")."""
        return (("load", "train") + (("torch_clip",) if self.clip == "torch" else ())
                + (("fused_adamw",) if self.optimizer == "fused" else ()))

    def __post_init__(self):
        families.family(self.family)
        if self.layout not in tf_adapter.LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; known: {sorted(tf_adapter.LAYOUTS)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; known: {OPTIMIZERS}")
        if self.steps < 1:
            raise ValueError(f"steps {self.steps}: at least 1")
        if self.resume_at is not None and not 1 <= self.resume_at < self.steps:
            raise ValueError(f"resume_at {self.resume_at}: a step before the last ({self.steps})")
        if self.clip not in (None, "torch", "per_mesh"):
            raise ValueError(f"unknown clip {self.clip!r}; known: torch, per_mesh")
        if self.bug is not None and self.bug not in TRAINING_BUGS:
            raise ValueError(f"unknown bug {self.bug!r}; known: {TRAINING_BUGS}")
        if self.bug == "stale_optimizer_state" and (self.resume_at or 0) < 2:
            raise ValueError("stale_optimizer_state needs resume_at >= 2 (an earlier save to load instead)")


def run_training(checkpoint: str, case: TrainCase, metrics_dir: str | None = None, model_class=None,
                 checkpoint_dir: str | None = None) -> dict:
    """The rank function of a training case; `checkpoint_dir` (a folder every rank sees) holds a resume case's
    saves."""
    metrics = rank_cases.case_metrics(case)
    metrics[contract.TRAIN_STEPS] = case.steps
    if case.planted_defect is not None:
        metrics[contract.PLANTED_DEFECT] = case.planted_defect
    if case.resume_at is not None:
        metrics[contract.RESUMED_AT_STEP] = case.resume_at
    return rank_cases.measured(metrics, metrics_dir,
                               lambda into: _train_and_compare(checkpoint, case, into, model_class, checkpoint_dir))


# ---------------------------------------------------------------- the loop, as users write it


def optimizer_for(model, case: TrainCase, *, reference: bool = False) -> torch.optim.Optimizer:
    """AdamW as the case asks; the float64 truth always takes the plain loop (fused kernels have no float64 on
    every device, and its arithmetic is the truth whatever kernel the others use)."""
    options = {"foreach": False} if reference else OPTIMIZER_OPTIONS[case.optimizer]
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, eps=ADAM_EPS, **options)


def warmup_schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS))


def micro_batches(step: int, other_order: bool = False) -> list[torch.Tensor]:
    """The step's micro-batches: the suite's batch, its sequences rolled by a different amount for each (distinct
    data every micro-batch and step; each token keeps its experts, so routing stays as clear as the router made
    it). `other_order`: the same data summed in another order (the micro-batches reversed, and the sequences of
    each), for the second sample of the whole model's rounding."""
    batch = tiny_models.make_batch()
    batches = [batch.roll(shifts=MICRO_BATCHES * (step - 1) + index + 1, dims=1) for index in range(MICRO_BATCHES)]
    return [each.flip(0) for each in reversed(batches)] if other_order else batches


@dataclass
class Run:
    """One model's training loop and what it measured at its latest step."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    clip: str = "torch"
    other_order: bool = False  # the second sample of the whole model's rounding (rank_cases.perturbed_rounding)
    grads: dict = None  # the accumulated gradients of the latest step, before clipping
    loss: float = math.nan
    grad_norm: float = math.nan


def clip_gradients(model, clip: str) -> torch.Tensor:
    """The global gradient norm, clipped to MAX_GRAD_NORM. "torch": torch.nn.utils.clip_grad_norm_, as users call
    it. "per_mesh": what a model whose parameters live on several device meshes needs instead (clip_grad_norm_
    cannot span meshes: a known upstream bug, its own case): one norm per mesh, each reduced over its mesh, then
    combined, as transformers' Trainer (`_mixed_mesh_grad_norm`) and torchtitan do."""
    if clip == "torch":
        return torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    from torch.nn.utils import clip_grads_with_norm_, get_total_norm

    by_mesh: dict = {}
    for param in model.parameters():
        if param.grad is not None:
            by_mesh.setdefault(param.grad.device_mesh if isinstance(param.grad, DTensor) else None, []).append(param)
    norms = [full(get_total_norm([param.grad for param in params])) for params in by_mesh.values()]
    total = torch.linalg.vector_norm(torch.stack(norms))
    for params in by_mesh.values():
        clip_grads_with_norm_(params, MAX_GRAD_NORM, total)
    return total


def train_step(run: Run, step: int, loss_of) -> None:
    """Accumulate over the micro-batches, clip, step the optimizer and the schedule. `loss_of(model, batch)` is
    the model's loss on its share of `batch` (a tensor to backward) and the global loss (a float)."""
    total = 0.0
    for batch in micro_batches(step, run.other_order):
        with rank_cases.perturbed_rounding(run.model) if run.other_order else contextlib.nullcontext():
            loss, global_loss = loss_of(run.model, batch)
        (loss / MICRO_BATCHES).backward()
        total += global_loss / MICRO_BATCHES
    run.grads = {name: None if param.grad is None else param.grad.detach().clone()
                 for name, param in run.model.named_parameters()}
    norm = clip_gradients(run.model, run.clip)
    run.loss, run.grad_norm = total, float(full(norm).item())
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)


# ---------------------------------------------------------------- one case


def _train_and_compare(checkpoint: str, case: TrainCase, metrics: dict, model_class, checkpoint_dir) -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = rank_cases.rank_device()
    dtype = getattr(torch, case.dtype)
    layout = tf_adapter.LAYOUTS[case.layout]
    family = families.family(case.family)

    def load_whole():
        return tf_adapter.load_whole(checkpoint, dtype, device, case.experts_implementation, model_class)

    def load_sharded():
        if case.layout == "fully_shard":
            model = tf_adapter.load_whole(checkpoint, dtype, device, cls=model_class)
            return rank_cases.fully_shard_model(model, world_size, device)
        return tf_adapter.load_sharded(checkpoint, case.layout, world_size, dtype, case.experts_implementation,
                                       model_class)

    def start(model, reference: bool = False, other_order: bool = False) -> Run:
        model.train()
        optimizer = optimizer_for(model, case, reference=reference)
        # the whole models clip as the sharded one does: the same arithmetic where they have one mesh
        return Run(model, optimizer, warmup_schedule(optimizer), clip=case.clipping, other_order=other_order)

    sharded, whole = start(load_sharded()), start(load_whole())
    with together("the load check"):  # the cause first, where loading went wrong
        rank_cases.check_load(sharded.model, whole.model, family, layout, rank, world_size)
    # The truth (float64), and the whole model's rounding sampled twice: as it is, and summed in another order
    # with every leaf output moved by up to an ulp (tolerances.py: one sample can be lucky).
    reference = start(tf_adapter.load_reference(checkpoint, dtype, device, model_class), reference=True)
    samples = (whole, start(load_whole(), other_order=True))
    shares = ([rank_cases.batch_rows(layout, other, world_size) for other in range(world_size)]
              if layout.splits_batch else [slice(None)])
    rows = rank_cases.batch_rows(layout, rank, world_size)

    def whole_loss(model, batch):
        logits = rank_cases.model_logits(model, batch)
        loss = sum(rank_cases.next_token_loss(logits[share], batch[share]) for share in shares) / len(shares)
        return loss, loss.item()

    def sharded_loss(model, batch):
        mine = rank_cases.next_token_loss(rank_cases.model_logits(model, batch[rows]), batch[rows])
        if not layout.splits_batch:
            return mine, mine.item()
        total = mine.detach().clone()
        dist.all_reduce(total)
        return mine, total.item() / world_size

    saves = Path(checkpoint_dir) if checkpoint_dir else None
    for step in range(1, case.steps + 1):
        before = _replicated_values(sharded.model, family, layout) if _plants(case, rank, world_size, step) else None
        train_step(sharded, step, sharded_loss)
        if before is not None:
            _skip_one_update(sharded.model, before)
        for sample in samples:
            train_step(sample, step, whole_loss)
        with stay_float64():
            train_step(reference, step, whole_loss)
        _record_step(metrics, step, sharded, whole)
        compare_step(step, sharded, samples, reference, family, layout, case.dtype, metrics)
        if case.resume_at is not None and saves is not None:
            if case.bug == "stale_optimizer_state" and step == case.resume_at - 1:
                save_state(sharded, saves / f"step{step}")
            if step == case.resume_at:
                save_state(sharded, saves / f"step{step}")
                stale = case.bug == "stale_optimizer_state"  # every rank: the resume reads the wrong save
                sharded = start(load_sharded())
                load_state(sharded, saves / f"step{step}", optimizer_from=saves / f"step{step - 1}" if stale else None)


def _plants(case: TrainCase, rank: int, world_size: int, step: int) -> bool:
    return case.bug == "skip_replicated_update" and rank == world_size - 1 and step == BUG_STEP


def _record_step(metrics: dict, step: int, sharded: Run, whole: Run) -> None:
    metrics[contract.LOSS_STEP.format(step=step)] = sharded.loss
    metrics[contract.WHOLE_LOSS_STEP.format(step=step)] = whole.loss
    metrics[contract.GRAD_NORM_STEP.format(step=step)] = sharded.grad_norm


# ---------------------------------------------------------------- the checks of a step


def compare_step(step: int, sharded: Run, samples: tuple[Run, ...], reference: Run, family: families.Family,
                 layout: tf_adapter.Layout, dtype_name: str, metrics: dict) -> None:
    """Replicated parameters first (a rank that drifted at the last step explains every other difference), then
    the loss, the accumulated gradients, the global gradient norm and the updated parameters against float64, each
    within the whole runs' own distance from it (the larger of the two samples). The worst gradient and parameter
    of any step go into `metrics`."""
    with together(f"step {step}: the replicated parameters check"):
        check_replicated(step, sharded.model, family, layout)
    check_scalar(step, "loss", sharded.loss, [run.loss for run in samples], reference.loss, dtype_name)
    errors, bounds = compared(sharded.grads, [run.grads for run in samples], reference.grads, family, layout,
                              dtype_name, step)
    keep_worst(metrics, (contract.GRAD_ERROR, contract.GRAD_BOUND, contract.GRAD_ERROR_PARAM), errors, bounds, step)
    problem = checks.over_bounds("gradients", errors, bounds)
    with together(f"step {step}: the gradients check"):
        if problem is not None:
            raise AssertionError(f"step {step}: {problem} (accumulated over {MICRO_BATCHES} micro-batches)")
    check_scalar(step, "gradient norm", sharded.grad_norm, [run.grad_norm for run in samples], reference.grad_norm,
                 dtype_name)
    errors, bounds = compared(parameters(sharded), [parameters(run) for run in samples], parameters(reference), family,
                              layout, dtype_name, step)
    keep_worst(metrics, (contract.PARAM_ERROR, contract.PARAM_BOUND, contract.PARAM_ERROR_PARAM), errors, bounds, step)
    problem = checks.over_bounds("updated parameters", errors, bounds)
    with together(f"step {step}: the parameters check"):
        if problem is not None:
            raise AssertionError(f"step {step}: {problem}")


def keep_worst(metrics: dict, names: tuple[str, str, str], errors: dict, bounds: dict, step: int) -> None:
    """The worst error against its bound so far, its bound and "step K: parameter" under `names`."""
    error_name, bound_name, where_name = names
    worst = checks.worst_parameter(errors, bounds)
    if error_name not in metrics or checks.ratio_to_bound(errors[worst], bounds[worst]) > checks.ratio_to_bound(
            metrics[error_name], metrics[bound_name]):
        metrics.update({error_name: errors[worst], bound_name: bounds[worst], where_name: f"step {step}: {worst}"})


def parameters(run: Run) -> dict[str, torch.Tensor]:
    return {name: param.detach() for name, param in run.model.named_parameters()}


def check_scalar(step: int, name: str, mine: float, samples: list[float], truth: float, dtype_name: str) -> None:
    """A number every rank agrees on (the loss, the global gradient norm) within the whole runs' distance from the
    float64 run."""
    problem = scalar_problem(step, name, mine, samples, truth, dtype_name)
    with together(f"step {step}: the {name} check"):
        if problem is not None:
            raise AssertionError(problem)


def scalar_problem(step: int, name: str, mine: float, samples: list[float], truth: float,
                   dtype_name: str) -> str | None:
    """What is wrong with `mine` against the float64 run's `truth`, bounded by the whole runs' `samples`; None when
    nothing is."""
    bound = tolerances.training_widening(step) * tolerances.logits_bound(
        dtype_name, rank_cases.largest(abs(sample - truth) for sample in samples), abs(truth))
    if abs(mine - truth) <= bound:
        return None
    return (f"step {step}: {name} {mine:.9g} differs from the float64 run's {truth:.9g} by {abs(mine - truth):.3g}, "
            f"over its bound {bound:.3g} (the whole model's run: {samples[0]:.9g})")


def compared(sharded: dict, samples: list[dict], truth: dict, family, layout, dtype_name: str,
             step: int) -> tuple[dict, dict]:
    """Each tensor's relative error against float64 (the sharded model's from the ranks' parts: sharded_errors), and
    its bound from the whole runs' larger error for the same tensor, widened from step 2 (tolerances.py)."""
    errors = sharded_errors(sharded, truth, family, layout)
    sampled = [checks.gradient_errors(sample, truth) for sample in samples]
    widening = tolerances.training_widening(step)
    return errors, {name: widening * tolerances.gradient_bound(dtype_name,
                                                               rank_cases.largest(each[name] for each in sampled))
                    for name in errors}


def sharded_errors(sharded: dict, truth: dict, family, layout) -> dict[str, float]:
    """Each tensor's relative error (L2 over the whole tensor) against the float64 `truth`, from this rank's part of
    it and the same part of the truth, summed over the ranks in one all-reduce: no gathers, and every rank gets
    the same numbers. A part every rank holds (a replicated tensor) counts on each, in both sums alike."""
    names = list(sharded)
    sums = torch.zeros(2, len(names), dtype=torch.float64)
    device = torch.device("cpu")
    for index, name in enumerate(names):
        mine, expected = sharded[name], truth[name]
        if mine is None or expected is None:
            continue
        part, expected_part = _part(name, mine, expected, family, layout)
        if part.shape != expected_part.shape:
            raise AssertionError(f"{name}: this rank holds shape {tuple(part.shape)} where its share of the whole "
                                 f"model's is {tuple(expected_part.shape)}")
        device = part.device
        sums[0, index] = (part.double() - expected_part.double().to(part.device)).square().sum().cpu()
        sums[1, index] = expected_part.double().square().sum().cpu()
    summed = sums.to(device)
    dist.all_reduce(summed)
    sums = summed.cpu()
    errors = {}
    for index, name in enumerate(names):
        if sharded[name] is None or truth[name] is None:
            errors[name] = 0.0 if sharded[name] is None and truth[name] is None else math.inf
            continue
        difference, scale = sums[0, index].item(), sums[1, index].item()
        errors[name] = (0.0 if difference == 0.0 else math.inf) if scale == 0.0 else math.sqrt(difference / scale)
    return errors


def _part(name: str, tensor: torch.Tensor, whole: torch.Tensor, family, layout) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's part of a sharded tensor and the same part of the whole one: a DTensor's local shard (by its own
    placements), a rank's plain expert share under EP, else the tensor itself."""
    if isinstance(tensor, DTensor):
        if any(isinstance(placement, Partial) for placement in tensor.placements):
            return tensor.full_tensor(), whole  # a pending sum: its local part is no part of the value
        return tensor.to_local(), rank_cases.dtensor_share(whole, tensor)
    if layout.experts_sharded and family.is_expert_stack(name):
        return tensor, rank_cases.expert_share(whole, dist.get_rank(), dist.get_world_size())
    return tensor, whole


def replicated_names(model, family: families.Family, layout: tf_adapter.Layout) -> list[str]:
    """The parameters every rank holds whole: neither a rank's expert share nor an FSDP shard."""
    names = []
    for name, param in model.named_parameters():
        if layout.experts_sharded and family.is_expert_stack(name):
            continue
        if isinstance(param, DTensor) and any(isinstance(p, Shard) for p in param.placements):
            continue
        names.append(name)
    return names


def check_replicated(step: int, model, family: families.Family, layout: tf_adapter.Layout) -> None:
    """Every replicated parameter bit-identical on every rank: each rank's copies, as bytes, gathered in one
    collective and compared with rank 0's."""
    params = dict(model.named_parameters())
    names = replicated_names(model, family, layout)
    if not names:
        return
    values = [local(params[name]).detach().contiguous() for name in names]
    mine = torch.cat([value.reshape(-1).view(torch.uint8) for value in values])
    copies = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, mine)
    start = 0
    for name, value in zip(names, values, strict=True):
        end = start + value.numel() * value.element_size()
        for other, copy in enumerate(copies[1:], start=1):
            if not torch.equal(copy[start:end], copies[0][start:end]):
                theirs, first = (each[start:end].view(value.dtype) for each in (copy, copies[0]))
                difference = checks.largest_difference(theirs, first)
                raise AssertionError(f"step {step}: parameter {name} differs across ranks "
                                     f"(rank {other} vs rank 0: {difference:.3g})")
        start = end


# ---------------------------------------------------------------- checkpoints


def save_state(run: Run, folder: Path) -> None:
    """Model and optimizer state through torch.distributed.checkpoint (each rank writes its shards), and the
    schedule's state beside them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(run.model, run.optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(folder))
    if dist.get_rank() == 0:
        torch.save(run.scheduler.state_dict(), folder / "scheduler.pt")
    dist.barrier()


def load_state(run: Run, folder: Path, optimizer_from: Path | None = None) -> None:
    """`run` (a freshly loaded model, a new optimizer and schedule) continues from `folder`; `optimizer_from`
    reads the optimizer state from another save (the planted stale-state bug)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(run.model, run.optimizer)
    dcp.load({"model": model_state}, checkpoint_id=str(folder))
    dcp.load({"optimizer": optimizer_state}, checkpoint_id=str(optimizer_from or folder))
    set_state_dict(run.model, run.optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)
    run.scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))


# ---------------------------------------------------------------- deliberate bugs


def _replicated_values(model, family, layout) -> dict[str, torch.Tensor]:
    """The first replicated parameter's value before the step (the planted bug puts it back after)."""
    names = replicated_names(model, family, layout)
    if not names:
        raise AssertionError(f"the {layout.name} layout replicates no parameter to plant the bug on")
    name = next((name for name in names if "norm" in name), names[0])
    return {name: local(dict(model.named_parameters())[name]).detach().clone()}


def _skip_one_update(model, before: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in before.items():
            local(params[name]).copy_(value)

