"""The other two ways users train a sharded model, beside training/steps.py's plain torch loop: `accelerate` (an
`Accelerator`, `prepare(model, optimizer, scheduler)`, `accelerator.accumulate`, `accelerator.backward`,
`accelerator.clip_grad_norm_`) and `transformers.Trainer` (a tiny in-memory dataset, `max_steps`, its own
optimizer, schedule and gradient clipping). Each trains the sharded model STEPS steps on every rank and is
compared after every step, with training/steps.py's checks (`compare_step`: replicated parameters bit-identical
across ranks, then loss, accumulated gradients, global gradient norm and updated parameters against float64,
within the bounds the whole model's own runs set).

What the sharded run is compared with: the whole model (twice, as training/steps.py samples its rounding) and the
float64 truth, each trained by training/steps.py's plain loop (`steps.train_step`) in the same process, with the
same arithmetic as the library's loop, not through the library itself:
- accelerate: `Accelerator.accumulate` + `backward` divide each micro-batch's loss by the accumulation steps and
  sum the gradients, `clip_grad_norm_` clips by one norm per device mesh (`_clip_grad_norm_dtensor_aware`, the
  arithmetic of training/steps.py's "per_mesh", which on a whole model is torch's clip_grad_norm_), and the prepared
  optimizer and schedule are training/steps.py's own AdamW and warm-up. (The prepared schedule steps once per process
  per optimizer step, as accelerate does for data it assumes split across the processes; training/steps.py's warm-up
  reaches its plateau after one step either way, so its learning rates are the same: 0.5, 1, 1 x LEARNING_RATE.)
- Trainer: its own optimizer (`optim="adamw_torch"`, weight decay on the parameters `get_decay_parameter_names`
  picks, none on biases and norms) and its own schedule (`constant_with_warmup` over WARMUP_STEPS steps: the
  learning rate is 0 at step 1, then 0.5, 1 x LEARNING_RATE), rebuilt for the whole runs from the Trainer's own
  `get_optimizer_cls_and_kwargs`, `get_decay_parameter_names` and `get_scheduler`. It normalises the loss by the
  tokens of the whole accumulated batch (`num_items_in_batch`) where the plain loop averages the micro-batches'
  means: the same number, the micro-batches being of equal size.
Why the plain loop and not the library on the whole model: the library's own single-process path adds nothing
(accelerate with one process wraps nothing; the Trainer on one process runs the same accumulate-clip-step), while
a second library instance in the same process would share accelerate's global state with the sharded run's.

Where a library refuses the layout on this device at setup, before any step (accelerate's ParallelismConfig on
DistributedType.MULTI_CPU: every accelerate case, and the Trainer on an EP model), the ranks report its message
and the case is not run with it (REFUSED, turned into a skip by conftest's `run_user_loop`). A refusal is
recognised by asking the library: a ValueError raised inside accelerate while the loop is set up. Anything later
is a failure.
"""

from __future__ import annotations

import contextlib
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

# Imported with this module (the ranks unpickle the rank function, so they are part of a fresh rank's state): the
# Trainer's and accelerate's modules, first imported during a call, would make the rank pool replace its ranks.
import transformers.trainer  # noqa: F401
from checks import planted, rank_cases
from checks.case import SuiteCase
from checks.kinds import Check
from checks.tensors import full, local
from loading import tf_adapter
from models import families, tiny_models

from harness import contract
from harness.ranks import together
from training import steps

LOOPS = ("accelerate", "trainer")
STEPS = 3
# A case's metric holding the library's refusal (its message): the case is not run, with that reason.
REFUSED = contract.REFUSED_BY_LIBRARY
# The planted bug (checks/planted.py: USER_LOOP_BUGS) acts at this step.
BUG_STEP = 2
# Trainer's schedule with a warm-up, the nearest to training/steps.py's (all of transformers' warm-ups start at 0).
TRAINER_SCHEDULE = "constant_with_warmup"


@dataclass(frozen=True)
class UserLoopCase(SuiteCase):
    """A user's own training loop (accelerate's, the Trainer's) on the sharded model against the whole model's."""

    loop: str  # one of LOOPS
    steps: int = STEPS

    BUGS = planted.USER_LOOP_BUGS

    @property
    def checks(self) -> tuple[Check, ...]:
        """For the known-bugs table: a user loop loads (and checks the load) and trains, as a training case."""
        return (Check.LOAD, Check.TRAIN)

    def __post_init__(self):
        super().__post_init__()
        if self.loop not in LOOPS:
            raise ValueError(f"unknown loop {self.loop!r}; known: {LOOPS}")
        if self.steps < BUG_STEP and self.bug is not None:
            raise ValueError(f"the planted bug acts at step {BUG_STEP}: steps {self.steps} is too few")


def run_user_loop(checkpoint: str, case: UserLoopCase, metrics_dir: str | None = None, model_class=None) -> dict:
    """The rank function of a user-loop case: its metrics, with REFUSED where the library refused the layout."""
    return rank_cases.measured(steps.training_metrics(case), metrics_dir,
                               lambda into: _train_and_compare(checkpoint, case, into, model_class))


# ---------------------------------------------------------------- what every rank shares with training/steps.py's loop


@dataclass
class Setting:
    """One case on this rank: training/steps.py's side of it (how each model loads, the losses), and the whole runs."""

    case: UserLoopCase
    loop: steps.CaseLoop
    share: dict[str, steps.Run] = field(default_factory=dict)  # this rank's whole runs (steps.WHOLE_RUN_MAKERS)
    workdir: str = ""  # a folder of this rank's, removed after the case (the Trainer's output_dir)

    @property
    def family(self) -> families.Family:
        return self.loop.family

    @property
    def layout(self) -> tf_adapter.LayoutTraits:
        return self.loop.layout

    @property
    def device(self) -> torch.device:
        return self.loop.device

    @property
    def world_size(self) -> int:
        return self.loop.world_size

    @property
    def data_parallel_ranks(self) -> int:
        """How many ranks split each micro-batch (the others share it)."""
        return self.world_size if self.layout.splits_batch else 1

    def sharded_loss(self, model, batch: torch.Tensor) -> tuple[torch.Tensor, float]:
        return self.loop.sharded_loss(model, batch)

    def whole_loss(self, model, batch: torch.Tensor) -> tuple[torch.Tensor, float]:
        return self.loop.whole_loss(model, batch)

    def step_and_compare(self, step: int, sharded: steps.Run, metrics: dict) -> None:
        """The whole runs take the same step with steps.py's plain loop; then steps.py's per-step
        checks."""
        *samples, truth = self.loop.step_whole_runs(step, self.share)
        steps.record_step(metrics, step, sharded, samples[0])
        steps.compare_step(step, sharded, tuple(samples), truth, self.family, self.layout, self.case.dtype,
                              metrics)


def _train_and_compare(checkpoint: str, case: UserLoopCase, metrics: dict, model_class) -> None:
    setting = Setting(case, steps.CaseLoop(checkpoint, _plain_loop_case(case), model_class))
    model, whole = setting.loop.load_sharded(), setting.loop.load_whole()
    with together("the load check"):
        rank_cases.check_load(model, whole, setting.family, setting.layout, dist.get_rank(), setting.world_size)
    loop = _AccelerateLoop() if case.loop == "accelerate" else _TrainerLoop()
    with _fresh_accelerate_state(), tempfile.TemporaryDirectory(prefix="user-loop-") as workdir:
        setting.workdir = workdir
        prepared = loop.set_up(model, setting)
        if _agreed_refusal(prepared, setting.device, metrics):
            return
        # the whole runs: as they are, and summed in another order (training/steps.py's two samples), and the
        # truth; this rank's share of them (steps.WHOLE_RUN_MAKERS: each made on one rank)
        makes = setting.loop.makes
        if makes("as is"):
            setting.share["as is"] = loop.whole_run(prepared, whole, setting)
        if makes("other order"):
            setting.share["other order"] = loop.whole_run(prepared, setting.loop.load_whole(), setting,
                                                          other_order=True)
        if makes("truth"):
            setting.share["truth"] = loop.whole_run(prepared, setting.loop.load_reference(), setting,
                                                    reference=True)
        loop.train(prepared, setting, metrics)


@contextlib.contextmanager
def _fresh_accelerate_state():
    """accelerate keeps its state in process-wide singletons: a rank that runs case after case starts each one
    without the last one's, and leaves none behind."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    try:
        yield
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


# ---------------------------------------------------------------- a library's refusal


@dataclass(frozen=True)
class Refusal:
    """The library said no to this layout on this device while the loop was set up."""

    message: str


def refusal(error: BaseException) -> Refusal | None:
    """`error` as accelerate's refusal of a setting (a ValueError raised in accelerate itself), or None."""
    import accelerate

    if not isinstance(error, ValueError):
        return None
    frames = traceback.extract_tb(error.__traceback__)
    package = Path(accelerate.__file__).parent
    if not frames or not Path(frames[-1].filename).is_relative_to(package):
        return None
    return Refusal(f"accelerate {accelerate.__version__} refuses it: {error}")


def _refused_at_setup(set_up):
    """`set_up()`'s value, or the library's refusal."""
    try:
        return set_up()
    except ValueError as error:
        refused = refusal(error)
        if refused is None:
            raise
        return refused


def _agreed_refusal(prepared, device: torch.device, metrics: dict) -> bool:
    """Whether the ranks' library refused (on one rank, then on all: the others would wait in the next
    collective); the refusal's message goes into `metrics` under REFUSED."""
    refused = torch.tensor([isinstance(prepared, Refusal)], dtype=torch.int32, device=device)
    dist.all_reduce(refused, op=dist.ReduceOp.MAX)
    if not refused.item():
        return False
    messages = [None] * dist.get_world_size()
    dist.all_gather_object(messages, prepared.message if isinstance(prepared, Refusal) else None)
    metrics[REFUSED] = next(message for message in messages if message is not None)
    return True


def _plants(case: UserLoopCase, step: int) -> bool:
    return case.bug == "skip_optimizer_step" and step == BUG_STEP and dist.get_rank() == dist.get_world_size() - 1


@contextlib.contextmanager
def _update_undone(model, active: bool):
    """The planted bug: what the optimizer step inside the block did to this rank's parameters is put back."""
    if not active:
        yield
        return
    before = {name: local(param).detach().clone() for name, param in model.named_parameters()}
    yield
    with torch.no_grad():
        for name, param in model.named_parameters():
            local(param).copy_(before[name])


def _grads(model) -> dict:
    return {name: None if param.grad is None else param.grad.detach().clone()
            for name, param in model.named_parameters()}


# ---------------------------------------------------------------- accelerate


class _AccelerateLoop:
    """The loop of accelerate's documentation: prepare, then per micro-batch `accumulate`, `backward`, and on the
    step's last one `clip_grad_norm_`; the prepared optimizer and schedule step (and zero) only then."""

    def set_up(self, model, setting: Setting):
        return _refused_at_setup(lambda: self._prepare(model, setting))

    def _prepare(self, model, setting: Setting):
        accelerator = accelerator_for(model, setting)
        optimizer = steps.optimizer_for(model, _plain_loop_case(setting.case))
        scheduler = steps.warmup_schedule(optimizer)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        model.train()
        return accelerator, steps.Run(model, optimizer, scheduler)

    def whole_run(self, prepared, model, setting: Setting, *, reference: bool = False,
                  other_order: bool = False) -> steps.Run:
        model.train()
        optimizer = steps.optimizer_for(model, _plain_loop_case(setting.case), reference=reference)
        return steps.Run(model, optimizer, steps.warmup_schedule(optimizer), clip=_whole_clip(setting),
                            other_order=other_order)

    def train(self, prepared, setting: Setting, metrics: dict) -> None:
        accelerator, sharded = prepared
        for step in range(1, setting.case.steps + 1):
            self._step(accelerator, sharded, step, setting)
            setting.step_and_compare(step, sharded, metrics)

    @staticmethod
    def _step(accelerator, run: steps.Run, step: int, setting: Setting) -> None:
        total = 0.0
        for batch in steps.micro_batches(step):
            with accelerator.accumulate(run.model):
                loss, global_loss = setting.sharded_loss(run.model, batch)
                accelerator.backward(loss)
                total += global_loss / steps.MICRO_BATCHES
                if accelerator.sync_gradients:
                    run.grads = _grads(run.model)
                    run.grad_norm = float(full(
                        accelerator.clip_grad_norm_(run.model.parameters(), steps.MAX_GRAD_NORM)).item())
                with _update_undone(run.model, accelerator.sync_gradients and _plants(setting.case, step)):
                    run.optimizer.step()
                run.scheduler.step()
                run.optimizer.zero_grad(set_to_none=True)
        run.loss = total


def accelerator_for(model, setting: Setting):
    """An Accelerator told how the model is already laid out, as the Trainer tells it (`ParallelismConfig` of the
    model's TP size and the data-parallel rest), with FSDP2 where the model is FSDP2-sharded (accelerate then
    leaves its sharding as it is), on the ranks' device (`cpu=True` on CPU ranks: accelerate's MULTI_CPU, what the
    Trainer asks for there; without it accelerate takes each rank for a process of its own)."""
    from accelerate import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig
    from torch.distributed.fsdp import FSDPModule

    tp_size = getattr(model, "tp_size", None) or 1
    options = {
        "gradient_accumulation_steps": steps.MICRO_BATCHES,
        "cpu": setting.device.type == "cpu",
        "parallelism_config": ParallelismConfig(tp_size=tp_size, dp_shard_size=setting.world_size // tp_size),
    }
    if isinstance(model, FSDPModule):
        options["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2)
    return Accelerator(**options)


def _plain_loop_case(case: UserLoopCase) -> steps.TrainCase:
    """training/steps.py's case of the same layout, for its optimizer (torch's default AdamW kernels) and clipping."""
    return steps.TrainCase(family=case.family, layout=case.layout, dtype=case.dtype, steps=case.steps,
                              experts_implementation=case.experts_implementation)


def _whole_clip(setting: Setting) -> str:
    return _plain_loop_case(setting.case).clipping


# ---------------------------------------------------------------- transformers.Trainer


class _TrainerLoop:
    """`Trainer(model, args, train_dataset).train()` with the suite's micro-batches as its dataset, in order; a
    callback compares every step as it is logged."""

    def set_up(self, model, setting: Setting):
        return _refused_at_setup(lambda: self._trainer(model, setting, setting.workdir))

    def _trainer(self, model, setting: Setting, output_dir: str):
        from transformers import Trainer, TrainingArguments

        args = TrainingArguments(
            output_dir=output_dir,
            max_steps=setting.case.steps,
            per_device_train_batch_size=tiny_models.BATCH_SIZE // setting.data_parallel_ranks,
            gradient_accumulation_steps=steps.MICRO_BATCHES,
            learning_rate=steps.LEARNING_RATE,
            weight_decay=steps.WEIGHT_DECAY,
            adam_epsilon=steps.ADAM_EPS,
            max_grad_norm=steps.MAX_GRAD_NORM,
            lr_scheduler_type=TRAINER_SCHEDULE,
            warmup_steps=steps.WARMUP_STEPS,
            optim="adamw_torch",
            train_sampling_strategy="sequential",
            logging_strategy="steps",
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            use_cpu=setting.device.type == "cpu",
            **_fsdp_arguments(model),
        )
        recording = _recording_trainer_class(Trainer)
        trainer = recording(model=model, args=args, train_dataset=dataset(setting.case.steps))
        return _fsdp_declined(trainer) or trainer

    def whole_run(self, trainer, model, setting: Setting, *, reference: bool = False,
                  other_order: bool = False) -> steps.Run:
        """The whole model with the Trainer's own optimizer (its decay groups, class and keywords) and schedule."""
        from transformers import get_scheduler

        model.train()
        decay = set(trainer.get_decay_parameter_names(model))
        groups = [
            {"params": [param for name, param in model.named_parameters() if name in decay],
             "weight_decay": trainer.args.weight_decay},
            {"params": [param for name, param in model.named_parameters() if name not in decay], "weight_decay": 0.0},
        ]
        optimizer_class, options = trainer.get_optimizer_cls_and_kwargs(trainer.args, model)
        optimizer = optimizer_class(groups, **options, **({"foreach": False} if reference else {}))
        count = setting.case.steps
        scheduler = get_scheduler(trainer.args.lr_scheduler_type, optimizer,
                                  num_warmup_steps=trainer.args.get_warmup_steps(count), num_training_steps=count)
        return steps.Run(model, optimizer, scheduler, clip=_whole_clip(setting), other_order=other_order)

    def train(self, trainer, setting: Setting, metrics: dict) -> None:
        trainer.add_callback(_step_checks(trainer, setting, metrics))
        trainer.train()
        taken = trainer.state.global_step
        if taken != setting.case.steps:
            raise AssertionError(f"the Trainer took {taken} steps where max_steps is {setting.case.steps}")


def dataset(count: int) -> list[dict[str, torch.Tensor]]:
    """Every micro-batch of `count` steps, row by row, in training order: the Trainer's sequential sampler hands
    each step's micro-batches out as steps.micro_batches makes them, and a data-parallel rank r gets rows
    r*B/N..(r+1)*B/N of each, as rank_cases.batch_rows gives them (accelerate's sharded batch sampler)."""
    return [{"input_ids": row, "labels": row}
            for step in range(1, count + 1) for batch in steps.micro_batches(step) for row in batch]


def _fsdp_arguments(model) -> dict:
    """A model sharded with torch's fully_shard by the user (not at load time by transformers) is declared to the
    Trainer as FSDP2, which accelerate then leaves as it is sharded."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule) or getattr(model, "is_distributed_loading_by_transformers", False):
        return {}
    return {"fsdp": "full_shard", "fsdp_config": {"version": 2}}


def _fsdp_declined(trainer) -> Refusal | None:
    """Asked for FSDP (TrainingArguments(fsdp=...)), accelerate takes it only on MULTI_{device} ranks: elsewhere
    (MULTI_CPU) its state keeps its own distributed type and no FSDP plugin, and the Trainer would wrap the FSDP2
    model in DDP. Its state says so before any step."""
    import accelerate

    if not trainer.args.fsdp or trainer.is_fsdp_enabled:
        return None
    return Refusal(f"accelerate {accelerate.__version__} declines FSDP here: TrainingArguments(fsdp=...) given, its "
                   f"state is {trainer.accelerator.distributed_type} without an FSDP plugin (the Trainer would wrap "
                   "the FSDP2 model in DDP)")


def _recording_trainer_class(trainer_class):
    """The Trainer, keeping each step's accumulated gradients before it clips them (its callbacks only see them
    clipped): `training_step` is its documented point of extension, and the arithmetic stays its own."""

    class RecordingTrainer(trainer_class):  # type: ignore[misc,valid-type]  # the Trainer class it is given
        accumulated_grads: dict | None = None

        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            if self.accelerator.sync_gradients:  # the step's last micro-batch: the gradients are complete
                self.accumulated_grads = _grads(model)
            return loss

    return RecordingTrainer


def _step_checks(trainer, setting: Setting, metrics: dict):
    """A TrainerCallback: the planted bug around the optimizer step, and at each step's log (after the update;
    loss and gradient norm as the Trainer logs them) the whole runs' step and training/steps.py's checks."""
    from transformers import TrainerCallback

    # The Trainer steps its own optimizer and schedule: the sharded run only measures.
    sharded = steps.Run(trainer.model, None, None)  # type: ignore[arg-type]

    class StepChecks(TrainerCallback):
        undo = None

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.undo = _update_undone(trainer.model, _plants(setting.case, state.global_step + 1))
            self.undo.__enter__()

        def on_optimizer_step(self, args, state, control, **kwargs):
            assert self.undo is not None  # entered in on_pre_optimizer_step
            self.undo.__exit__(None, None, None)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "grad_norm" not in logs:
                return  # the run's summary at the end
            sharded.loss, sharded.grad_norm = float(logs["loss"]), float(logs["grad_norm"])
            sharded.grads = trainer.accumulated_grads
            setting.step_and_compare(state.global_step, sharded, metrics)

    return StepChecks()

