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
the whole model's own runs set (checks/tolerances.py, the same rule as the load and gradient checks: the whole model
trained twice, as it is and summed in another order with every leaf output moved by up to an ulp, the larger
error counting), and every parameter the layout replicates must be bit-identical on every rank. A failure
names the step and the check: `step 2: parameter model.norm.weight differs across ranks (rank 1 vs rank 0: ...)`.

A resume case saves model, optimizer and scheduler with torch.distributed.checkpoint after step `resume_at`,
loads them into a freshly loaded sharded model, and continues: the rest must match the uninterrupted whole run.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# Imported with this module (the ranks unpickle its rank function, so they are part of a fresh rank's state), not
# at a resume case's first save: a module first imported during a call makes the rank pool replace its ranks.
import torch.distributed.checkpoint
import torch.distributed.checkpoint.state_dict
from checks import planted, rank_cases, tolerances, verdicts
from checks.case import SuiteCase
from checks.kinds import Check, Layout
from checks.tensors import full, local
from loading import tf_adapter
from loading.float64_mode import stay_float64
from models import families, tiny_models
from torch.distributed.tensor import DTensor, Partial, Shard

from harness import contract
from harness.ranks import handover, together

with contextlib.suppress(ImportError):  # torch's private modules that dcp.save/load and torch.save first import
    import torch.distributed.checkpoint._fsspec_filesystem  # an fsspec path, tried first
    import torch.utils.serialization  # torch.save's config

# AdamW's keyword arguments per case variant: torch's default kernels (foreach where every parameter is on a
# device that has them), the plain loop, the fused kernel
OPTIMIZER_OPTIONS = {"default": {}, "foreach_off": {"foreach": False}, "fused": {"fused": True}}
OPTIMIZERS = tuple(OPTIMIZER_OPTIONS)
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01
# At the first step AdamW's update is lr * g / (|g| + eps): with torch's default eps (1e-8) that is lr * sign(g) for
# every gradient element above 1e-8, so an element whose gradient is rounding noise gets +-lr by the noise's sign
# and the parameter check compares coin flips (gpt_oss, EP, bfloat16: q_proj.bias 0.186 against a bound of 0.125
# at eps 1e-8). At 1e-6 the update is continuous in such gradients but steepest there (d update / dg = lr / eps =
# 1e3 at g = 0): a gradient element that cancels to about eps turns its rounding into a parameter error (hy_v4, EP,
# float32, transformers 5.25.0, step 3: layers.2.ffn_hc.scale 3.98e-05 against a bound of 3.12e-05 under avx2
# kernels, while under `default` the whole model's own two samples read 3.8e-05 and 2.1e-05 and the sharded 4.2e-06:
# the same noise landing on another run). At 1e-5 the slope is 100, that case's worst ratio 0.2 under both kernels,
# and every gradient element above 1e-4 (clipped gradients have norm 1) still moves by about lr.
ADAM_EPS = 1e-5
WARMUP_STEPS = 2
# Below the tiny models' global gradient norm (about 3-40 at the first step), so clipping scales every step.
MAX_GRAD_NORM = 1.0
MICRO_BATCHES = 2
ONE_STEP_CHECKS = (Check.LOGITS, Check.GRADIENTS)  # rank_cases.CHECKS a case with `one_step` runs before training
BUG_STEP = 2
# The whole model's runs are one computation, the same on every rank (the same loss over every rank's share of the
# batch): each is made on one rank, this one modulo the world size, and sent to every rank after each step
# (CaseLoop.step_whole_runs). Every rank made all three before: a training case's largest cost after the sharded
# run, in a row on every rank; now a case waits on its slowest maker (2 ranks: the two samples on rank 0).
WHOLE_RUN_MAKERS = {"as is": 0, "truth": 1, "other order": 2}
CPU = torch.device("cpu")


@dataclass(frozen=True)
class TrainCase(SuiteCase):
    """Steps of training, sharded and whole, compared after every step; a planted bug acts inside the loop."""

    steps: int = 3
    optimizer: str = "default"  # how AdamW runs: torch's default kernels, foreach=False, or fused=True
    resume_at: int | None = None  # save after this step, load into a fresh sharded model, continue
    # "per_mesh" where the layout puts parameters on several device meshes (EP, FSDP2+EP), else torch's
    # clip_grad_norm_; "torch" asks for clip_grad_norm_ on any layout (the case that shows it cannot span meshes)
    clip: str | None = None
    # the one-step checks first (logits, routing, gradients of one forward and backward), on the models the case
    # then trains: one load serves both
    one_step: bool = False
    # compare with the whole model's runs an earlier layout of the family made in this rank, where they are the same
    # computation (WholeRuns); False makes them again
    reuse_whole_runs: bool = True
    # FSDP2's MixedPrecisionPolicy: parameters and optimizer state in float32, forward and backward in `dtype`
    # (bfloat16), gradients reduced in float32; the whole model's runs compute the same way (Run.compute)
    mixed_precision: bool = False

    BUGS = planted.TRAINING_BUGS

    @property
    def clipping(self) -> str:
        if self.clip is not None:
            return self.clip
        return "per_mesh" if tf_adapter.LAYOUTS[self.layout].experts_sharded else "torch"

    @property
    def checks(self) -> tuple[Check, ...]:
        """What a training case runs, for the known-bugs table: it loads (and checks the load), runs the one-step
        checks where it asks to, trains, and clips with torch's clip_grad_norm_ or steps the fused AdamW where it
        asks to. An entry for the one-step checks covers only a case that runs them (their failures read otherwise
        than "step K: ...")."""
        return ((Check.LOAD,) + (ONE_STEP_CHECKS if self.one_step else ()) + (Check.TRAIN,)
                + ((Check.TORCH_CLIP,) if self.clip == "torch" else ())
                + ((Check.FUSED_ADAMW,) if self.optimizer == "fused" else ())
                + ((Check.MIXED_PRECISION,) if self.mixed_precision else ()))

    @property
    def parameter_dtype(self) -> str:
        """The dtype the parameters (and the optimizer's state) are kept in: float32 under mixed precision."""
        return "float32" if self.mixed_precision else self.dtype

    def __post_init__(self):
        super().__post_init__()
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; known: {OPTIMIZERS}")
        if self.steps < 1:
            raise ValueError(f"steps {self.steps}: at least 1")
        if self.resume_at is not None and not 1 <= self.resume_at < self.steps:
            raise ValueError(f"resume_at {self.resume_at}: a step before the last ({self.steps})")
        if self.clip not in (None, "torch", "per_mesh"):
            raise ValueError(f"unknown clip {self.clip!r}; known: torch, per_mesh")
        if self.mixed_precision and (self.dtype != "bfloat16" or not tf_adapter.LAYOUTS[self.layout].fsdp_sharded):
            raise ValueError(f"mixed precision computes in bfloat16 on an FSDP2 layout, not {self.dtype} on "
                             f"{self.layout}")
        if self.bug == "stale_optimizer_state" and (self.resume_at or 0) < 2:
            raise ValueError("stale_optimizer_state needs resume_at >= 2 (an earlier save to load instead)")


def run_training(checkpoint: str, case: TrainCase, metrics_dir: str | None = None, model_class=None,
                 checkpoint_dir: str | None = None) -> dict:
    """The rank function of a training case; `checkpoint_dir` (a folder every rank sees) holds a resume case's
    saves."""
    return rank_cases.measured(training_metrics(case, case.resume_at), metrics_dir,
                               lambda into: _train_and_compare(checkpoint, case, into, model_class, checkpoint_dir))


def training_metrics(case, resumed_at: int | None = None) -> dict:
    """What names any training case (this module's, a user loop's, a checkpoint case's) in its metrics: the case,
    its steps, the step it resumed after and the defect it plants, where it has them."""
    metrics = rank_cases.case_metrics(case)
    metrics[contract.TRAIN_STEPS] = case.steps
    if resumed_at is not None:
        metrics[contract.RESUMED_AT_STEP] = resumed_at
    if case.planted_defect is not None:
        metrics[contract.PLANTED_DEFECT] = case.planted_defect
    return metrics


# ---------------------------------------------------------------- the loop, as users write it


def optimizer_for(model, case: TrainCase, *, reference: bool = False) -> torch.optim.Optimizer:
    """AdamW as the case asks; the float64 truth always takes the plain loop (fused kernels have no float64 on
    every device, and its arithmetic is the truth whatever kernel the others use)."""
    options: dict[str, Any] = {"foreach": False} if reference else OPTIMIZER_OPTIONS[case.optimizer]
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
    # Mixed precision on the whole model, as FSDP2's MixedPrecisionPolicy computes: a copy of the model in the
    # compute dtype, its parameters cast from the float32 ones before each micro-batch, its gradients cast to
    # float32 and summed into theirs
    compute: torch.nn.Module | None = None
    grads: dict = field(default_factory=dict)  # the accumulated gradients of the latest step, before clipping
    loss: float = math.nan
    grad_norm: float = math.nan

    @property
    def params(self) -> dict[str, torch.Tensor]:
        """The parameters as they are now (views: the next step changes them)."""
        return {name: param.detach() for name, param in self.model.named_parameters()}


@dataclass(frozen=True)
class StepResult:
    """What one of the whole model's runs measured at one step, kept (params copied) after it trained on."""

    loss: float
    grad_norm: float
    grads: dict
    params: dict

    @classmethod
    def of(cls, run: Run) -> StepResult:
        return cls(run.loss, run.grad_norm, run.grads, {name: value.clone() for name, value in run.params.items()})


class WholeRuns:
    """The whole model's runs (its two rounding samples and the float64 truth) of recent cases, per step, by what
    determines them: the checkpoint and model class, the dtype, the experts implementation the whole model resolved
    to, the ranks' shares of the batch, the optimizer's kernel, the clipping and the number of steps. The layouts of
    a family share them (EP and FSDP2+EP, FSDP2 and fully_shard: the whole model's loss is averaged over the ranks'
    shares of the batch for every layout), so a rank that runs a family's next layout compares with the runs an
    earlier case's rank of its number kept instead of making them again: the same code on the same numbers. Every
    rank keeps what it received (each run is made on one rank: WHOLE_RUN_MAKERS); a case reuses them only
    where every rank has them.

    Each test's ranks are fresh, so the runs are handed on as files, in the session's handover folder
    (harness.ranks.handover), read back with `torch.load(weights_only=True)`. A case never reads another's sharded
    results; with no folder (--no-ranks-pool, ranks across hosts) every case makes its own."""

    KEPT = 2  # entries per rank: a family's layouts run one after the other (test_training.py orders them so)

    def __init__(self, folder: Path | None):
        self.folder = folder

    @classmethod
    def of_this_rank(cls) -> WholeRuns:
        shared = handover.folder()
        rank = dist.get_rank() if dist.is_initialized() else 0
        return cls(None if shared is None else shared / "whole_runs" / f"rank{rank}")

    def get(self, key: tuple) -> list[tuple[StepResult, ...]] | None:
        if self.folder is None:
            return None
        path = self.folder / handover.entry_name(key)
        try:
            entry = torch.load(path, weights_only=True)
        except FileNotFoundError:
            return None
        if entry["key"] != repr(key):  # another key with the same name: not these runs
            return None
        self._touch(path)
        return [tuple(StepResult(**result) for result in step) for step in entry["steps"]]

    def put(self, key: tuple, steps: list[tuple[StepResult, ...]]) -> None:
        if self.folder is None:
            return
        # vars, not dataclasses.asdict: asdict would deep-copy every tensor before torch.save writes them
        entry = {"key": repr(key), "steps": [[dict(vars(result)) for result in step] for step in steps]}
        buffer = io.BytesIO()
        torch.save(entry, buffer)
        path = self.folder / handover.entry_name(key)
        handover.write_whole(path, buffer.getvalue())
        self._touch(path)
        for old in self._entries()[:-self.KEPT]:
            old.unlink(missing_ok=True)

    def _entries(self) -> list[Path]:
        """Oldest first."""
        if self.folder is None:
            return []
        entries = [path for path in self.folder.iterdir() if not path.name.startswith(".")]
        return sorted(entries, key=lambda path: path.stat().st_mtime_ns)

    def _touch(self, path: Path) -> None:
        """Make `path` the latest: its mtime after every other entry's (set, not read from a coarse clock)."""
        latest = max((other.stat().st_mtime_ns for other in self._entries() if other != path), default=0)
        stamp = max(time.time_ns(), latest + 1)
        os.utime(path, ns=(stamp, stamp))


def _on(device: torch.device, result: StepResult) -> StepResult:
    """`result` with its tensors on `device` (the same values: a copy moves no bit). A rank sends its whole runs
    on the CPU: a GPU tensor would unpickle onto the sender's device."""
    def moved(tensors: dict) -> dict:
        return {name: None if value is None else value.to(device) for name, value in tensors.items()}
    return StepResult(result.loss, result.grad_norm, moved(result.grads), moved(result.params))


def whole_runs_key(checkpoint: str, case: TrainCase, whole_model, world_size: int, model_class) -> tuple:
    resolved = getattr(whole_model.config, "_experts_implementation", None) or case.experts_implementation
    return (checkpoint, getattr(model_class, "__qualname__", None), case.dtype, case.mixed_precision, resolved,
            world_size, case.optimizer, case.clipping, case.steps)


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
        model = run.model if run.compute is None else _cast_for_compute(run.model, run.compute)
        with rank_cases.perturbed_rounding(model) if run.other_order else contextlib.nullcontext():
            loss, global_loss = loss_of(model, batch)
        (loss / MICRO_BATCHES).backward()
        if run.compute is not None:
            _add_gradients_in_float32(run.compute, run.model)
        total += global_loss / MICRO_BATCHES
    run.grads = {name: None if param.grad is None else param.grad.detach().clone()
                 for name, param in run.model.named_parameters()}
    norm = clip_gradients(run.model, run.clip)
    run.loss, run.grad_norm = total, float(full(norm).item())
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)


def _cast_for_compute(model, compute):
    """`compute` with `model`'s current parameters cast to its dtype (FSDP2's unsharded parameters under a
    MixedPrecisionPolicy), and no gradients."""
    with torch.no_grad():
        for mine, theirs in zip(compute.parameters(), model.parameters(), strict=True):
            mine.copy_(theirs)
    compute.zero_grad(set_to_none=True)
    return compute


def _add_gradients_in_float32(compute, model) -> None:
    """The micro-batch's gradients, cast up and added to the float32 parameters' (FSDP2's float32 reduction and
    accumulation)."""
    for mine, master in zip(compute.parameters(), model.parameters(), strict=True):
        if mine.grad is not None:
            grad = mine.grad.to(master.dtype)
            master.grad = grad if master.grad is None else master.grad + grad


# ---------------------------------------------------------------- one case


class CaseLoop:
    """This rank's side of a training case: how it loads each model, starts its loop, and computes each loop's
    loss. The checkpoint cases (training/checkpointing.py) train through the same."""

    def __init__(self, checkpoint: str, case: TrainCase, model_class):
        from transformers.utils import logging

        logging.disable_progress_bar()
        self.checkpoint, self.case, self.model_class = checkpoint, case, model_class
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = rank_cases.rank_device()
        self.dtype = getattr(torch, case.parameter_dtype)  # what the parameters are loaded and kept in
        self.layout = tf_adapter.LAYOUTS[case.layout]
        self.family = families.family(case.family)
        # The whole models' loss is averaged over the ranks' shares of the batch for every layout (the same number
        # as the whole batch's mean in real arithmetic), so that every layout's whole runs are the same (WholeRuns).
        self.shares = [rank_cases.share_rows(other, self.world_size) for other in range(self.world_size)]
        self.rows = rank_cases.batch_rows(self.layout, self.rank, self.world_size)
        self.loaded: tf_adapter.Loaded | None = None  # the first whole model as loaded, for the later ones

    def load_whole(self):
        """The whole model: loaded the first time, a copy of that as loaded after (tf_adapter.Loaded)."""
        model = tf_adapter.whole_as_loaded(self.loaded, self.checkpoint, self.dtype, self.device,
                                           self.case.experts_implementation, self.model_class)
        if self.loaded is None:
            self.loaded = tf_adapter.Loaded(copy.deepcopy(model), self.dtype, self.case.experts_implementation)
        return model

    def load_sharded(self):
        case = self.case
        if case.layout == Layout.FULLY_SHARD:
            model = tf_adapter.load_whole(self.checkpoint, self.dtype, self.device, cls=self.model_class)
            return rank_cases.fully_shard_model(model, self.world_size, self.device,
                                                mp_policy=_mixed_precision_policy(case))
        return tf_adapter.load_sharded(self.checkpoint, case.layout, self.world_size, self.dtype,
                                       case.experts_implementation, self.model_class,
                                       mixed_precision=case.mixed_precision)

    def load_reference(self):
        return tf_adapter.load_reference(self.checkpoint, self.dtype, self.device, self.model_class, self.loaded)

    def start(self, model, reference: bool = False, other_order: bool = False, sharded: bool = False) -> Run:
        """`model`'s loop: AdamW as the case asks (the plain loop for the float64 `reference`), the warm-up, the
        case's clipping (the whole models clip as the sharded one does: the same arithmetic where they have one
        mesh), and under mixed precision a whole model's compute copy."""
        case = self.case
        model.train()
        optimizer = optimizer_for(model, case, reference=reference)
        compute = None
        if case.mixed_precision and not (reference or sharded):
            compute = copy.deepcopy(model).to(getattr(torch, case.dtype))
        return Run(model, optimizer, warmup_schedule(optimizer), clip=case.clipping, other_order=other_order,
                   compute=compute)

    def whole_loss(self, model, batch):
        batch = batch.to(self.device)
        logits = rank_cases.model_logits(model, batch)
        loss = sum(rank_cases.next_token_loss(logits[share], batch[share]) for share in self.shares) / len(self.shares)
        return loss, float(loss)

    def sharded_loss(self, model, batch):
        """This rank's loss on its rows of `batch` (to backward), and the global loss every rank agrees on."""
        rows, batch = self.rows, batch.to(self.device)
        mine = rank_cases.next_token_loss(rank_cases.model_logits(model, batch[rows]), batch[rows])
        if not self.layout.splits_batch:
            return mine, mine.item()
        total = mine.detach().clone()
        dist.all_reduce(total)
        return mine, total.item() / self.world_size

    def makes(self, run: str) -> bool:
        """Whether this rank makes the whole run `run` (WHOLE_RUN_MAKERS)."""
        return self.rank == WHOLE_RUN_MAKERS[run] % self.world_size

    def share_of_whole_runs(self, whole: Run, truth: Run | None = None) -> dict[str, Run]:
        """This rank's share of the whole model's runs, by name: `whole` as it is, a second whole model summed in
        another order, the float64 truth (`truth` where it is loaded already)."""
        share = {}
        if self.makes("as is"):
            share["as is"] = whole
        if self.makes("other order"):
            share["other order"] = self.start(self.load_whole(), other_order=True)
        if self.makes("truth"):
            share["truth"] = truth or self.start(self.load_reference(), reference=True)
        return share

    def step_whole_runs(self, step: int, share: dict[str, Run]) -> tuple[StepResult, StepResult, StepResult]:
        """This rank's `share` of the whole model's runs takes step `step` (every rank calls it, with or without
        a share); every rank gets what each run measured: as it is, in another order, the truth."""
        for name, run in share.items():
            with stay_float64() if name == "truth" else contextlib.nullcontext():
                train_step(run, step, self.whole_loss)
        mine = {name: StepResult.of(run) for name, run in share.items()}
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, {name: _on(CPU, result) for name, result in mine.items()})

        def measured(name: str) -> StepResult:
            return mine.get(name) or _on(self.device, every[WHOLE_RUN_MAKERS[name] % self.world_size][name])

        return measured("as is"), measured("other order"), measured("truth")


def _train_and_compare(checkpoint: str, case: TrainCase, metrics: dict, model_class, checkpoint_dir) -> None:
    loop = CaseLoop(checkpoint, case, model_class)
    rank, world_size, layout, family = loop.rank, loop.world_size, loop.layout, loop.family
    sharded, whole = loop.start(loop.load_sharded(), sharded=True), loop.start(loop.load_whole())
    computed = LayerDtypes(sharded.model) if case.mixed_precision else None
    with together("the load check"):  # the cause first, where loading went wrong
        rank_cases.check_load(sharded.model, whole.model, family, layout, rank, world_size)
    key = whole_runs_key(checkpoint, case, whole.model, world_size, model_class)
    whole_runs = WholeRuns.of_this_rank()
    recorded = whole_runs.get(key) if case.reuse_whole_runs else None
    if not _on_every_rank(recorded is not None):  # made by their ranks (step_whole_runs): every rank, or none
        recorded = None
    metrics[contract.WHOLE_RUNS] = "made" if recorded is None else "reused"
    # The truth (float64), and the whole model's rounding sampled twice: as it is, and summed in another order
    # with every leaf output moved by up to an ulp (checks/tolerances.py: one sample can be lucky). Each loaded
    # where it is made (WHOLE_RUN_MAKERS); the one-step checks compare with the truth on every rank.
    reference = loop.start(loop.load_reference(), reference=True) if case.one_step else None
    if case.one_step:
        assert reference is not None  # made above for a case with one-step checks
        check_one_step(case, layout, family, (sharded, whole, reference), metrics)
    share = loop.share_of_whole_runs(whole, reference) if recorded is None else {}

    made: list[tuple[StepResult, ...]] = []
    saves = Path(checkpoint_dir) if checkpoint_dir else None
    for step in range(1, case.steps + 1):
        before = _replicated_values(sharded.model, family, layout) if _plants(case, rank, world_size, step) else None
        train_step(sharded, step, loop.sharded_loss)
        if computed is not None:
            with together(f"step {step}: the mixed precision check"):
                check_mixed_precision(step, sharded, computed, getattr(torch, case.dtype))
        if before is not None:
            _skip_one_update(sharded.model, before)
        if recorded is None:
            made.append(loop.step_whole_runs(step, share))
        *whole_samples, truth = (recorded or made)[step - 1]
        record_step(metrics, step, sharded, whole_samples[0])
        compare_step(step, sharded, tuple(whole_samples), truth, family, layout, case.dtype, metrics)
        if case.resume_at is not None and saves is not None:
            if case.bug == "stale_optimizer_state" and step == case.resume_at - 1:
                save_state(sharded, saves / f"step{step}")
            if step == case.resume_at:
                save_state(sharded, saves / f"step{step}")
                stale = case.bug == "stale_optimizer_state"  # every rank: the resume reads the wrong save
                sharded = loop.start(loop.load_sharded(), sharded=True)
                computed = LayerDtypes(sharded.model) if case.mixed_precision else None
                load_state(sharded, saves / f"step{step}", optimizer_from=saves / f"step{step - 1}" if stale else None)
    if recorded is None:
        whole_runs.put(key, made)


def _on_every_rank(holds: bool) -> bool:
    """Whether `holds` on every rank (a collective: every rank asks)."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, holds)
    return all(every)


class LayerDtypes:
    """The dtypes the decoder layers' outputs had since the last `take()` (a forward hook on each layer)."""

    def __init__(self, model):
        self._seen: set[torch.dtype] = set()
        for layer in model.model.layers:
            layer.register_forward_hook(self._record)

    def _record(self, module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        self._seen.add(hidden.dtype)

    def take(self) -> set[torch.dtype]:
        seen, self._seen = self._seen, set()
        return seen


def check_mixed_precision(step: int, run: Run, computed: LayerDtypes, compute_dtype: torch.dtype) -> None:
    """What a MixedPrecisionPolicy promises, seen directly (its rounding hides under the compute dtype's bound): the
    decoder layers computed in `compute_dtype`, while the parameters, their accumulated gradients and the
    optimizer's state stay float32."""
    seen = computed.take()
    if seen != {compute_dtype}:
        raise AssertionError(f"step {step}: the decoder layers computed in {sorted(map(str, seen))}, not "
                             f"{compute_dtype} (the mixed precision policy's compute dtype)")
    kept = {f"parameter {name}": param.dtype for name, param in run.model.named_parameters()}
    kept.update({f"gradient of {name}": grad.dtype for name, grad in run.grads.items() if grad is not None})
    for index, state in enumerate(run.optimizer.state.values()):
        kept.update({f"optimizer state {key} #{index}": value.dtype for key, value in state.items()
                     if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0})
    wrong = [f"{what} ({dtype})" for what, dtype in kept.items() if dtype != torch.float32]
    if wrong:
        raise AssertionError(f"step {step}: {len(wrong)} of {len(kept)} tensors are not float32 under mixed "
                             f"precision: {', '.join(wrong[:3])}")


def _mixed_precision_policy(case: TrainCase):
    """torch's MixedPrecisionPolicy for a mixed-precision case (the one transformers' fsdp_mixed_precision sets),
    else None."""
    if not case.mixed_precision:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=getattr(torch, case.dtype), reduce_dtype=torch.float32)


def check_one_step(case: TrainCase, layout, family, runs: tuple[Run, Run, Run], metrics: dict) -> None:
    """The one-step checks of rank_cases (logits as inference computes them, then routing and the gradients of one
    forward and backward) on the models about to train; their gradients are cleared after, so training starts
    from the state a case without them starts from."""
    models = rank_cases.Models(*(run.model for run in runs))
    for model in (models.sharded, models.whole, models.reference):
        model.eval()
    one_step = rank_cases.Case(case.family, case.layout, ONE_STEP_CHECKS, dtype=case.dtype,
                               experts_implementation=case.experts_implementation)
    rank_cases.check_one_step(models, family, one_step, layout, metrics)
    for model in (models.sharded, models.whole, models.reference):
        model.zero_grad(set_to_none=True)
        model.train()


def _plants(case: TrainCase, rank: int, world_size: int, step: int) -> bool:
    return case.bug == "skip_replicated_update" and rank == world_size - 1 and step == BUG_STEP


def record_step(metrics: dict, step: int, sharded: Run, whole: Run | StepResult) -> None:
    metrics[contract.LOSS_STEP.format(step=step)] = sharded.loss
    metrics[contract.WHOLE_LOSS_STEP.format(step=step)] = whole.loss
    metrics[contract.GRAD_NORM_STEP.format(step=step)] = sharded.grad_norm


# ---------------------------------------------------------------- the checks of a step


def compare_step(step: int, sharded: Run, samples: tuple[Run | StepResult, ...], reference: Run | StepResult,
                 family: families.Family,
                 layout: tf_adapter.LayoutTraits, dtype_name: str, metrics: dict) -> None:
    """Replicated parameters first (a rank that drifted at the last step explains every other difference), then
    the loss, the accumulated gradients, the global gradient norm and the updated parameters against float64, each
    within the whole runs' own distance from it (the larger of the two samples). The worst gradient and parameter
    of any step go into `metrics`."""
    with together(f"step {step}: the replicated parameters check"):
        check_replicated(step, sharded.model, family, layout)
    check_scalar(step, "loss", sharded.loss, [run.loss for run in samples], reference.loss, dtype_name)
    errors, bounds = compared(sharded.grads, [run.grads for run in samples], reference.grads, family, layout,
                              dtype_name, step, sharded.model)
    keep_worst(metrics, (contract.GRAD_ERROR, contract.GRAD_BOUND, contract.GRAD_ERROR_PARAM), errors, bounds, step)
    problem = verdicts.over_bounds("gradients", errors, bounds)
    with together(f"step {step}: the gradients check"):
        if problem is not None:
            raise AssertionError(f"step {step}: {problem} (accumulated over {MICRO_BATCHES} micro-batches)")
    check_scalar(step, "gradient norm", sharded.grad_norm, [run.grad_norm for run in samples], reference.grad_norm,
                 dtype_name)
    errors, bounds = compared(sharded.params, [run.params for run in samples], reference.params, family,
                              layout, dtype_name, step, sharded.model)
    keep_worst(metrics, (contract.PARAM_ERROR, contract.PARAM_BOUND, contract.PARAM_ERROR_PARAM), errors, bounds, step)
    problem = verdicts.over_bounds("updated parameters", errors, bounds)
    with together(f"step {step}: the parameters check"):
        if problem is not None:
            raise AssertionError(f"step {step}: {problem}")


def keep_worst(metrics: dict, names: tuple[str, str, str], errors: dict, bounds: dict, step: int) -> None:
    """The worst error against its bound so far, its bound and "step K: parameter" under `names`."""
    error_name, bound_name, where_name = names
    worst = verdicts.worst_parameter(errors, bounds)
    if error_name not in metrics or verdicts.ratio_to_bound(errors[worst], bounds[worst]) > verdicts.ratio_to_bound(
            metrics[error_name], metrics[bound_name]):
        metrics.update({error_name: errors[worst], bound_name: bounds[worst], where_name: f"step {step}: {worst}"})
        metrics.pop(contract.WHOLE_GRAD_ERROR, None)  # the one-step check's, about another error than this one


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
             step: int, model) -> tuple[dict, dict]:
    """Each tensor's relative error against float64 (the sharded model's from the ranks' parts: sharded_errors), and
    its bound from the whole runs' larger error for the same tensor, widened from step 2 (checks/tolerances.py)."""
    errors = sharded_errors(sharded, truth, family, layout, model)
    sampled = [verdicts.gradient_errors(sample, truth) for sample in samples]
    widening = tolerances.training_widening(step)
    return errors, {name: widening * tolerances.gradient_bound(dtype_name,
                                                               rank_cases.largest(each[name] for each in sampled))
                    for name in errors}


def sharded_errors(sharded: dict, truth: dict, family, layout, model) -> dict[str, float]:
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
        part, expected_part = _part(name, mine, expected, family, layout, model)
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


def _part(name: str, tensor: torch.Tensor, whole: torch.Tensor, family, layout,
          model) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's part of a sharded tensor and the same part of the whole one: a DTensor's local shard (by its own
    placements), a rank's plain expert share under EP, a plain TP shard's chunk (by the plan's style), else the
    tensor itself."""
    if isinstance(tensor, DTensor):
        if any(isinstance(placement, Partial) for placement in tensor.placements):
            return tensor.full_tensor(), whole  # a pending sum: its local part is no part of the value
        return tensor.to_local(), rank_cases.dtensor_share(whole, tensor)
    if layout.experts_sharded and family.is_expert_stack(name):
        return tensor, rank_cases.expert_share(whole, dist.get_rank(), dist.get_world_size())
    if tensor.shape != whole.shape and rank_cases.is_plain_tp_shard(model, name, tensor):
        share = rank_cases.tp_share(model, name, whole)
        assert share is not None  # whole is a tensor: so is its share
        return tensor, share
    return tensor, whole


def replicated_names(model, family: families.Family, layout: tf_adapter.LayoutTraits) -> list[str]:
    """The parameters every rank holds whole: neither a rank's expert share nor an FSDP shard."""
    names = []
    for name, param in model.named_parameters():
        if layout.experts_sharded and family.is_expert_stack(name):
            continue
        if isinstance(param, DTensor) and any(isinstance(p, Shard) for p in param.placements):
            continue
        if rank_cases.is_plain_tp_shard(model, name, param):
            continue
        names.append(name)
    return names


def check_replicated(step: int, model, family: families.Family, layout: tf_adapter.LayoutTraits) -> None:
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
        for other, other_bytes in enumerate(copies[1:], start=1):
            if not torch.equal(other_bytes[start:end], copies[0][start:end]):
                theirs, first = (each[start:end].view(value.dtype) for each in (other_bytes, copies[0]))
                difference = verdicts.largest_difference(theirs, first)
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

