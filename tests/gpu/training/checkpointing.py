"""Checkpoints of the sharded training loop (training/steps.py) that leave the world they were written in.

Two kinds of case, each a normal training run first (per step, the sharded model against the whole model's two
rounding samples and the float64 truth: steps.compare_step):

- "resume_other_world": steps 1..k at world A, model, optimizer and schedule saved with
  torch.distributed.checkpoint (DCP) to a folder every rank sees (phase 1); then, in a second launch at world
  B != A, a freshly loaded sharded model of the same layout (its load checked), the DCP state loaded into it (DCP
  reshards), its weights checked bit for bit against the full weights phase 1 saved beside the checkpoint, and
  steps k+1..N compared with the uninterrupted whole and float64 runs, which train all N steps there (phase 2).
- "save_pretrained": after N steps, `model.save_pretrained(folder)` from the sharded model, called on every rank
  as transformers documents for its distributed models (rank 0 writes: `should_save_on_this_rank`, the sharded
  weights gathered first), then the folder loaded whole (tf_adapter.load_whole): it must hold exactly the
  checkpoint's tensor names, and every weight must equal the sharded model's full weight bit for bit.

A failure names the step or the check: `step 3: updated parameters differ ...`, `resume at world 2: ...`,
`save_pretrained: ...`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from checks import planted, rank_cases
from checks.case import SuiteCase
from checks.kinds import Check
from checks.tensors import local
from loading import tf_adapter
from torch.distributed.tensor import DTensor

from harness.ranks import together
from training.steps import (
    CaseLoop,
    StepResult,
    TrainCase,
    compare_step,
    load_state,
    record_step,
    save_state,
    train_step,
    training_metrics,
)

# Imported with this module, as training/steps.py imports DCP's (a module first imported during a rank's call makes the
# rank pool replace its ranks)
with contextlib.suppress(ImportError):
    import numpy.ctypeslib  # noqa: F401  # by save_pretrained's safetensors writer

KINDS = ("resume_other_world", "save_pretrained")
# beside each DCP save: the sharded model's full weights, gathered (what the resumed model must hold)
SAVED_WEIGHTS = "full_weights.pt"


@dataclass(frozen=True)
class CheckpointCase(SuiteCase):
    """Training saved and loaded again: resumed at another world size, or saved whole with save_pretrained."""

    kind: str  # one of KINDS
    world_size: int = 2  # phase 1's (the only one of a save_pretrained case)
    resume_world_size: int | None = None  # resume_other_world: phase 2's
    steps: int = 4
    save_at: int = 2  # resume_other_world: phase 1 saves after this step
    # save_pretrained: pass torch's full state dict (get_model_state_dict, full_state_dict=True) as `state_dict=`,
    # what a model sharded outside transformers needs (upstream/repros/fully_shard_save_pretrained.py)
    full_state_dict: bool = False

    BUGS = planted.CHECKPOINT_BUGS

    @property
    def checks(self) -> tuple[Check, ...]:
        """For the known-bugs table: it loads (and checks the load), trains, and then resumes at another world or
        saves with save_pretrained."""
        return (Check.LOAD, Check.TRAIN, Check(self.kind + ("_full_state_dict" if self.full_state_dict else "")))

    @property
    def training(self) -> TrainCase:
        """The same loop as a training case: AdamW's default kernels, clipping per mesh where the layout needs it."""
        return TrainCase(self.family, self.layout, dtype=self.dtype, steps=self.steps,
                         experts_implementation=self.experts_implementation)

    @property
    def resumes(self) -> bool:
        return self.kind == "resume_other_world"

    @property
    def world_sizes(self) -> tuple[int, ...]:
        if self.resumes and self.resume_world_size is not None:  # always set on a resume (__post_init__)
            return (self.world_size, self.resume_world_size)
        return (self.world_size,)

    def __post_init__(self):
        super().__post_init__()
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind {self.kind!r}; known: {KINDS}")
        if self.resumes:
            if self.resume_world_size is None or self.resume_world_size == self.world_size:
                raise ValueError(f"resume_world_size {self.resume_world_size}: another world than {self.world_size}")
            if not 1 <= self.save_at < self.steps:
                raise ValueError(f"save_at {self.save_at}: a step before the last ({self.steps})")
        elif self.resume_world_size is not None:
            raise ValueError(f"a {self.kind} case runs at one world size")
        if self.full_state_dict and self.resumes:
            raise ValueError("full_state_dict is a save_pretrained case's option")
        if self.bug is not None and (not self.resumes or self.save_at < 2):
            raise ValueError("stale_optimizer_state needs a resume with save_at >= 2 (an earlier save to load)")


# ---------------------------------------------------------------- the rank functions, one per launch


def train_and_save(checkpoint: str, case: CheckpointCase, metrics_dir: str | None, model_class,
                   folder: str) -> dict:
    """Phase 1 (world A): train and compare each step; then save (DCP after step k, or save_pretrained after
    step N, loaded back whole and checked)."""
    return rank_cases.measured(_metrics(case), metrics_dir,
                               lambda into: _train_and_save(checkpoint, case, into, model_class, Path(folder)))


def resume_and_continue(checkpoint: str, case: CheckpointCase, metrics_dir: str | None, model_class,
                        folder: str) -> dict:
    """Phase 2 of a resume case (world B): a fresh sharded model takes the DCP state of step k, then trains on
    against the whole and float64 runs, which train every step here."""
    return rank_cases.measured(_metrics(case), metrics_dir,
                               lambda into: _resume_and_continue(checkpoint, case, into, model_class, Path(folder)))


def _metrics(case: CheckpointCase) -> dict:
    return training_metrics(case, case.save_at if case.resumes else None)


# ---------------------------------------------------------------- one phase's models


class Phase:
    """This rank's models in one launch, loaded and trained as training/steps.py's loop does (steps.CaseLoop)."""

    def __init__(self, checkpoint: str, case: CheckpointCase, model_class):
        self.case = case
        self.loop = CaseLoop(checkpoint, case.training, model_class)
        self.checkpoint, self.rank, self.world_size = checkpoint, self.loop.rank, self.loop.world_size
        self.layout, self.family, self.dtype, self.device = (self.loop.layout, self.loop.family, self.loop.dtype,
                                                             self.loop.device)
        self.model_class = model_class
        # the sharded run, and this rank's share of the whole model's two rounding samples and the float64 truth
        # (steps.WHOLE_RUN_MAKERS: each made on one rank, sent to every rank)
        loop = self.loop
        sharded, whole = loop.start(loop.load_sharded(), sharded=True), loop.start(loop.load_whole())
        with together("the load check"):
            rank_cases.check_load(sharded.model, whole.model, self.family, self.layout, self.rank, self.world_size)
        self.sharded = sharded
        self.share = loop.share_of_whole_runs(whole)

    def step_whole(self, step: int) -> tuple[StepResult, ...]:
        """The whole runs and the truth take step `step` (phase 2 replays steps 1..k on them alone; every rank
        calls it)."""
        return self.loop.step_whole_runs(step, self.share)

    def step_and_compare(self, step: int, metrics: dict) -> None:
        train_step(self.sharded, step, self.loop.sharded_loss)
        *samples, truth = self.step_whole(step)
        record_step(metrics, step, self.sharded, samples[0])
        compare_step(step, self.sharded, tuple(samples), truth, self.family, self.layout, self.case.dtype, metrics)

    def full_weights(self) -> dict[str, torch.Tensor]:
        """Every parameter of the sharded model, whole, on the CPU (collectives: every rank calls it): a DTensor
        gathered, a rank's plain expert share under EP gathered from every rank's, the rest as it is."""
        weights = {}
        for name, param in self.sharded.model.named_parameters():
            value = param.detach()
            if isinstance(value, DTensor):
                value = value.full_tensor()
            elif self.layout.experts_sharded and self.family.is_expert_stack(name):
                shares = [torch.empty_like(value) for _ in range(self.world_size)]
                dist.all_gather(shares, value.contiguous())
                value = torch.cat(shares)
            weights[name] = value.cpu().clone()
        return weights


# ---------------------------------------------------------------- phase 1


def _train_and_save(checkpoint: str, case: CheckpointCase, metrics: dict, model_class, folder: Path) -> None:
    phase = Phase(checkpoint, case, model_class)
    last = case.save_at if case.resumes else case.steps
    for step in range(1, last + 1):
        phase.step_and_compare(step, metrics)
        if case.bug == "stale_optimizer_state" and step == case.save_at - 1:
            save_state(phase.sharded, folder / f"step{step}")
    if not case.resumes:
        _save_pretrained_round_trip(phase, folder)
        return
    saved = folder / f"step{case.save_at}"
    save_state(phase.sharded, saved)
    weights = phase.full_weights()
    if phase.rank == 0:
        torch.save(weights, saved / SAVED_WEIGHTS)
    dist.barrier()


def _save_pretrained_round_trip(phase: Phase, folder: Path) -> None:
    """save_pretrained from every rank, then the folder loaded whole on every rank: the checkpoint's tensor names
    exactly, and each weight bit for bit the sharded model's (gathered)."""
    expected = phase.full_weights()
    state_dict = None
    if phase.case.full_state_dict:  # every rank gathers; rank 0 gets the weights, the others nothing
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state_dict = get_model_state_dict(phase.sharded.model,
                                          options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    with together("save_pretrained"):
        transformers_model: Any = phase.sharded.model  # nn.Module does not declare save_pretrained
        transformers_model.save_pretrained(folder, state_dict=state_dict)
    dist.barrier()  # transformers' own barrier follows rank 0's writes; this one holds where it has none
    with together("save_pretrained: the saved tensor names check"):
        names_problem = _saved_names_problem(Path(phase.checkpoint), folder)
        if names_problem is not None:
            raise AssertionError(f"save_pretrained: {names_problem}")
    loaded = tf_adapter.load_whole(str(folder), phase.dtype, phase.device, phase.case.experts_implementation,
                                   phase.model_class)
    problems = []
    params = dict(loaded.named_parameters())
    if params.keys() != expected.keys():
        problems.append(f"loaded whole it has parameters {sorted(params.keys() - expected.keys())} the sharded model "
                        f"has not, and lacks {sorted(expected.keys() - params.keys())}")
    for name in sorted(params.keys() & expected.keys()):
        mine, theirs = params[name].detach().cpu(), expected[name]
        if mine.shape != theirs.shape:
            problems.append(f"{name} has shape {tuple(mine.shape)}, the sharded model's {tuple(theirs.shape)}")
        elif not torch.equal(mine, theirs):
            problems.append(f"{name} differs from the sharded model's (largest difference "
                            f"{(mine.double() - theirs.double()).abs().max().item():.3g})")
    with together("save_pretrained: the saved weights check"):
        if problems:
            shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
            raise AssertionError(f"save_pretrained: the folder loaded whole differs from the trained sharded model "
                                 f"(world {phase.world_size}): {shown}")


def _saved_names_problem(original: Path, saved: Path) -> str | None:
    """What differs between the tensor names of two safetensors checkpoints (folders), or None."""
    names = [_safetensors_names(folder) for folder in (original, saved)]
    if names[0] == names[1]:
        return None
    return (f"the folder holds tensors {sorted(names[1] - names[0])} the checkpoint loaded has not, and lacks "
            f"{sorted(names[0] - names[1])}")


def _safetensors_names(folder: Path) -> set[str]:
    from safetensors import safe_open

    names = set()
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            names.update(handle.keys())
    return names


# ---------------------------------------------------------------- phase 2


def _resume_and_continue(checkpoint: str, case: CheckpointCase, metrics: dict, model_class, folder: Path) -> None:
    phase = Phase(checkpoint, case, model_class)
    saved = folder / f"step{case.save_at}"
    stale = folder / f"step{case.save_at - 1}" if case.bug == "stale_optimizer_state" else None
    with together(f"resume at world {phase.world_size}: loading the DCP state saved at world {case.world_size}"):
        load_state(phase.sharded, saved, optimizer_from=stale)
    _check_resumed_weights(phase, torch.load(saved / SAVED_WEIGHTS, weights_only=True))
    for step in range(1, case.save_at + 1):
        phase.step_whole(step)
    for step in range(case.save_at + 1, case.steps + 1):
        phase.step_and_compare(step, metrics)


def _check_resumed_weights(phase: Phase, saved: dict[str, torch.Tensor]) -> None:
    """Each rank holds exactly its share of the weights phase 1 saved: its own expert share, its FSDP chunk (by the
    parameter's own placements), the rest whole."""
    problems = []
    for name, param in phase.sharded.model.named_parameters():
        value = param.detach()
        whole = saved[name].to(value.device)
        if isinstance(value, DTensor):
            expected = rank_cases.dtensor_share(whole, value)
        elif phase.layout.experts_sharded and phase.family.is_expert_stack(name):
            expected = rank_cases.expert_share(whole, phase.rank, phase.world_size)
        else:
            expected = whole
        mine = local(value)
        if mine.shape != expected.shape:
            problems.append(f"{name}: rank {phase.rank} holds shape {tuple(mine.shape)}, its share of the saved "
                            f"weight is {tuple(expected.shape)}")
        elif not torch.equal(mine, expected):
            problems.append(f"rank {phase.rank}'s {name} differs from its share of the saved weight (largest "
                            f"difference {(mine.double() - expected.double()).abs().max().item():.3g})")
    with together(f"resume at world {phase.world_size}: the resumed weights check"):
        if problems:
            shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
            raise AssertionError(f"resume at world {phase.world_size} from a checkpoint saved at world "
                                 f"{phase.case.world_size} after step {phase.case.save_at}: {shown}")

