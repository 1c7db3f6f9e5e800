"""A training case's curve, read from its JUnit properties (contract: train_steps, loss_step_K,
whole_loss_step_K, grad_norm_step_K, resumed_at_step): what the report shows of a failing training case and the
nightly keeps for trends. Untrusted like every property: the step count is bounded, and a value that is not a
number stays a label."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from harness.contract import GRAD_NORM_STEP, LOSS_STEP, RESUMED_AT_STEP, TRAIN_STEPS, WHOLE_LOSS_STEP
from harness.results.values import Number, number, whole_number

# More steps than a report can show in a row: a case that claims more is read up to here.
MAX_STEPS = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingCurve:
    """Per step (index 0 is step 1): the sharded run's loss and global gradient norm, the whole model's loss."""

    losses: tuple[Number | None, ...]
    whole_losses: tuple[Number | None, ...]
    grad_norms: tuple[Number | None, ...]
    resumed_at: int | None = None  # the step after which the run resumed from its checkpoint

    @property
    def steps(self) -> int:
        return len(self.losses)

    def rows(self) -> tuple[tuple[int, Number | None, Number | None, Number | None], ...]:
        """(step, sharded loss, whole loss, gradient norm), from step 1."""
        return tuple((index + 1, loss, whole, norm) for index, (loss, whole, norm)
                     in enumerate(zip(self.losses, self.whole_losses, self.grad_norms, strict=True)))


def training_curve(values: Mapping[str, str]) -> TrainingCurve | None:
    """The curve a training case recorded; None for a case that trained nothing."""
    steps = whole_number(values.get(TRAIN_STEPS), 1)
    if steps is None:
        return None
    steps = min(steps, MAX_STEPS)

    def per_step(name: str) -> tuple[Number | None, ...]:
        return tuple(number(values.get(name.format(step=step))) for step in range(1, steps + 1))

    resumed = whole_number(values.get(RESUMED_AT_STEP), 1)
    return TrainingCurve(losses=per_step(LOSS_STEP), whole_losses=per_step(WHOLE_LOSS_STEP),
                         grad_norms=per_step(GRAD_NORM_STEP),
                         resumed_at=resumed if resumed is not None and resumed < steps else None)
